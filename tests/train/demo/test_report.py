"""The demo's report reads right: an acceptance axis that shows differences, a legend clear of
the bars, both speeds labelled, what limits the figures, and a warning on a busy machine."""

from __future__ import annotations

import pytest

from osprey_train.demo.pipeline import busy_warning
from osprey_train.demo.report import acceptance_axis, figure, headline, render_markdown

DOMAINS = ("chat", "code", "math")


def _summary(converted=1.048, distilled=1.05, live_al=1.05, plain=12.1, spec=3.2) -> dict:
    def offline(value):
        return {"overall": value, "per_domain": {d: value + 0.01 * k for k, d in enumerate(DOMAINS)}}

    return {
        "target": "tiny", "source": "tiny", "quick": True, "device": "cpu", "cpu_threads": 1, "lr": 5e-4,
        "sizes": {"prune_layers": 2, "train_prompts": 16, "eval_prompts": 5, "max_new_tokens": 24,
                  "ttt_steps": 2, "draft_steps": 3},
        "distill": {"steps": 20, "last_train": {}},
        "offline": {"converted": offline(converted), "distilled": offline(distilled)},
        "live": {"acceptance_length": live_al,
                 "per_domain": {d: {"acceptance_length": live_al + 0.01 * k} for k, d in enumerate(DOMAINS)},
                 "plain_tokens": 100, "plain_seconds": 100 / plain, "plain_tokens_per_s": plain,
                 "spec_tokens": 100, "spec_seconds": 100 / spec, "spec_tokens_per_s": spec,
                 "speedup": spec / plain, "greedy_identical": 5, "num_prompts": 5},
        "timings_s": {"total": 170.0}, "load_average_before": 0.5, "load_average_after": 1.0,
        "busy_warning": None,
    }


def test_acceptance_axis_shows_differences():
    lo, hi = acceptance_axis([1.048, 1.184, 1.1])
    assert 0.9 < lo < 1.048 and 1.184 < hi < 1.3
    # the 0.136 gap spans a good part of the axis, not 12% of a 0-1.1 axis
    assert (1.184 - 1.048) / (hi - lo) > 0.4
    assert acceptance_axis([1.0, 1.0]) == pytest.approx((0.97, 1.025))


def test_legend_clear_of_bars_and_both_speeds_labelled():
    import matplotlib.pyplot as plt
    from matplotlib.transforms import Bbox

    fig = figure(_summary())
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax1, ax2 = fig.axes
        legend = ax1.get_legend().get_window_extent(renderer)
        inside = ax1.get_window_extent(renderer)
        for patch in ax1.patches:  # the part of each bar that is drawn (clipped to the axes)
            visible = Bbox.intersection(patch.get_window_extent(renderer), inside)
            assert visible is not None and not legend.overlaps(visible), "the legend covers a bar"
        lo, hi = ax1.get_ylim()
        assert lo > 0.9  # not a 0-based axis
        labels = [t.get_text() for t in ax2.texts]
        assert "12.1 tok/s" in labels and "3.2 tok/s" in labels
        assert "speedup x0.26" in ax2.get_title()
    finally:
        plt.close(fig)


def test_report_says_what_limits_the_figures():
    md = render_markdown(_summary())
    assert "What limits these figures: distillation did not raise acceptance (+0.002)" in md
    assert "16 training prompts" in md and "20 distillation steps" in md
    assert "x0.26 of the target alone" in md
    md = render_markdown(_summary(distilled=1.2, live_al=1.2, spec=20.0))
    assert "acceptance rose by +0.152" in md and "did not raise" not in md


def test_busy_machine_gets_a_one_line_warning():
    assert busy_warning(1.5, 2, quick=True) is None and busy_warning(None, 2, quick=True) is None
    line = busy_warning(4.2, 2, quick=True)
    assert "\n" not in line and "load average 4.2 on 2 cores" in line and "about 3 minutes" in line
    md = render_markdown({**_summary(), "busy_warning": line})
    assert line in md


def test_report_says_n_per_domain_and_what_acceptance_one_means():
    import matplotlib.pyplot as plt

    s = _summary()
    for k, d in enumerate(DOMAINS):
        s["live"]["per_domain"][d]["prompts"] = (1, 2, 2)[k]
    md = render_markdown(s)
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in md.splitlines()
            if line.startswith("| ") and line.count("|") == 6}
    assert rows["chat"] == "1" and rows["code"] == "2" and rows["math"] == "2" and rows["**all**"] == "5"
    assert "n = held-out prompts per domain" in md and "from 1 to 2 prompt(s)" in md and "n = 1: a single prompt" in md
    assert "Acceptance length 1.0 means no drafted token was accepted" in md and "4 (S + 1)" in md
    fig = figure(s)
    try:
        ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        assert ticks == ["chat\nn=1", "code\nn=2", "math\nn=2", "all\nn=5"]
        assert "1.0 = no draft accepted" in fig.axes[0].get_title()
    finally:
        plt.close(fig)
    # a summary without counts (an older demo.json) still renders
    assert "| chat | ? |" in render_markdown(_summary())


def test_a_slowdown_reads_as_one():
    """Issue 48: the demo's last line and its report said ``speedup x0.56`` for a 1.8x slowdown."""
    summary = _summary(plain=12.5, spec=7.0)
    line = headline(summary, "osprey-demo/report.md")
    assert "speedup x0.56 (slower than plain decoding)," in line
    assert "Speedup x0.56 (slower than plain decoding)." in render_markdown(summary)
    assert "slower" not in headline(_summary(plain=10.0, spec=13.0), "r.md")


def test_an_auto_live_run_is_not_compared_with_offline_as_if_it_were_one_s():
    summary = _summary()
    summary["live"]["draft_length"] = {"max_steps": 5, "rounds_by_steps": {0: 90, 1: 10}, "probes": 4, "explored": 3,
                                       "cost": {"source": "measured at the start of this run"}}
    md = render_markdown(summary)
    assert "Draft length: auto (S = 0..5, 0 = a plain step; costs measured at the start of this run): " \
           "S=0 in 90 (90%), S=1 in 10 (10%) of 100 rounds (4 probes, 3 explored)" in md
    assert "is not offline's fixed S=3 acceptance length" in md and "difference" not in md
    assert "(draft length auto)" in headline(summary, "r.md")
