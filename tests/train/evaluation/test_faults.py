"""Untrusted strings in evaluation reports: a domain from a store or a prompt file cannot forge
lines or reach the terminal as escape sequences (issue #12, item 16)."""

from __future__ import annotations

from osprey_train.evaluation.acceptance import AcceptanceReport
from osprey_train.evaluation.live_report import summarize

CRAFTED = "chat\nNOTE: proxy figure — forged\x1b[31m\u202e"


def test_acceptance_text_escapes_domains():
    report = AcceptanceReport(steps=2, overall=1.5, per_domain={CRAFTED: 1.5}, per_position=[0.5, 0.2],
                              num_samples=1, num_verify_steps=2, num_tokens=3, per_domain_samples={CRAFTED: 1})
    text = report.to_text()
    assert "\x1b" not in text and "\u202e" not in text
    assert not any(line.startswith("NOTE") for line in text.splitlines())  # no forged line
    assert "chat\\nNOTE: proxy figure — forged\\x1b[31m\\u202e" in text
    assert report.to_dict()["per_domain"] == {CRAFTED: 1.5}  # data itself is untouched


def test_live_markdown_escapes_domains():
    sample = {"id": "a\x1b]0;title\x07", "domain": CRAFTED, "tokens": 4, "verify_steps": 2,
              "accept_lengths": [1, 1], "drafted": [2, 2], "accepted": [1, 1], "seconds": 0.1,
              "plain_seconds": 0.2, "plain_tokens": 4, "identical": True, "finish_reason": "length"}
    text = summarize([sample], steps=2, temperature=0.0, baseline=True).to_markdown()
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert not any(line.startswith("NOTE") for line in text.splitlines())
