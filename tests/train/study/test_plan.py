"""Stage keys and order: shared stages, what changes a key and what does not, machine independence."""

from __future__ import annotations

import shutil

import pytest

from osprey_data.errors import ConfigError

from osprey_train.study.config import load_study
from osprey_train.study.plan import build_plan
from tests.helpers.tiny_study import write_tiny_study


@pytest.fixture()
def spec(tmp_path, tiny_llama_dir):
    return write_tiny_study(tmp_path / "spec", tiny_llama_dir)


def _keys(path):
    plan = build_plan(load_study(path))
    return plan, {(n.kind, n.label): n.key for n in plan.nodes}


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_order_shares_stages_and_puts_the_main_comparison_first(spec):
    plan, _ = _keys(spec)
    kinds = [n.kind for n in plan.nodes]
    assert kinds[:9] == ["model", "prompts", "prompts", "prompts", "prompts", "store", "store", "store", "store"]
    keys = [n.key for n in plan.nodes]
    assert len(set(keys)) == len(keys)                              # every stage once
    assert plan.live is plan.nodes[-1] and plan.live.pending         # 'best' is chosen after the cells
    # both Osprey seeds and the KD arm share the stores; the Osprey seeds share one Stage-2 backbone
    o0, o1 = plan.drafters["osprey", 0, "chat"], plan.drafters["osprey", 1, "chat"]
    assert o0.deps["store"] is o1.deps["store"] is plan.drafters["eagle3", 0, "chat"].deps["store"]
    assert o0.deps["init"].deps["backbone"] is o1.deps["init"].deps["backbone"] is plan.pretrain["plain"]
    assert plan.pretrain["kd"].deps["teacher"] is plan.nodes[0]      # the source (= the target) teaches
    # arms in the file's order, each seed by seed and domain by domain
    order = [(n.arm, n.seed, n.domain) for n in plan.nodes if n.kind == "distill"]
    assert order == [(a, s, d) for a, seeds in (("osprey", (0, 1)), ("eagle3", (0,)), ("osprey-kd", (0,)))
                     for s in seeds for d in ("chat", "math")]
    # each drafter's matrix row right after it: every eval domain
    assert {k[3] for k in plan.cells if k[:3] == ("osprey", 0, "chat")} == {"chat", "math"}


def test_what_changes_a_key(spec):
    _, base = _keys(spec)
    _edit(spec, "lr = 3e-3\nttt_steps", "lr = 1e-3\nttt_steps")              # the distillation lr
    _, lr = _keys(spec)
    changed = {k for k in base if base[k] != lr.get(k)}
    assert changed and {kind for kind, _ in changed} == {"distill", "eval"}
    _edit(spec, "batch_size = 4\nshard_max_tokens = 64", "batch_size = 2\nshard_max_tokens = 32")  # operational only
    _, op = _keys(spec)
    assert op == lr
    math = spec.parent / "data" / "math.train.jsonl"
    math.write_text(math.read_text().replace("Two plus two", "2 + 2"))       # prompt content
    _, content = _keys(spec)
    changed = {label for (kind, label) in op if op[kind, label] != content.get((kind, label))}
    assert "store math train" in changed and "store chat train" not in changed
    assert "stage 2 (next-token prediction)" not in changed                 # Stage 2 is target-agnostic


def test_keys_do_not_depend_on_where_the_files_are(spec, tmp_path):
    _, here = _keys(spec)
    moved = tmp_path / "elsewhere"
    shutil.copytree(spec.parent, moved)
    _, there = _keys(moved / spec.name)
    assert here == there


def test_arch_options_of_an_arm_enter_its_convert_key_and_nothing_else_moves(spec):
    """Issue 44: an arm sets its architecture's options (a DFlash block size, objective); the convert
    stages of arms without them keep the keys they had before the option existed."""
    plan, base = _keys(spec)
    convert = plan.drafters["eagle3", 0, "chat"].deps["init"]
    assert "arch_option" not in convert.settings.key()        # unset: not in the key, as before the option
    text = spec.read_text() + '\n[[arms]]\nname = "dflash"\narch = "dflash"\nstage2 = "none"\n'
    spec.write_text(text + 'arch_options = { block_size = 6, objective = "topk" }\n')
    plan, keys = _keys(spec)
    assert all(keys[k] == v for k, v in base.items())
    node = plan.drafters["dflash", 0, "chat"].deps["init"]
    assert node.settings.arch_option == ("block_size=6", 'objective="topk"')
    spec.write_text(text + 'arch_options = { block_size = 8 }\n')
    assert _keys(spec)[0].drafters["dflash", 0, "chat"].deps["init"].key != node.key
    spec.write_text(text + 'arch_options = { blocks = 8 }\n')
    with pytest.raises(ConfigError, match=r"arch_options \['blocks'\] are not options of the 'dflash' arch"):
        load_study(spec)
    spec.write_text(text.replace('name = "dflash"\narch = "dflash"', 'name = "e3"\narch = "eagle3"')
                    + 'arch_options = { block_size = 8 }\n')
    with pytest.raises(ConfigError, match="it takes none"):
        load_study(spec)


def test_a_dflash_arm_with_backbone_true_converts_the_stage2_backbone_the_osprey_arm_uses(spec):
    """Issue 44: DFlash from the Osprey backbone is an arm of the same study; from scratch stays the default."""
    _, base = _keys(spec)
    text = spec.read_text()
    for name, extra in (("dflash", ""), ("dflash-bb", "backbone = true\nstage2 = \"plain\"\n")):
        text += f'\n[[arms]]\nname = "{name}"\narch = "dflash"\n' + ("stage2 = \"none\"\n" if not extra else extra)
    spec.write_text(text)
    plan, _ = _keys(spec)
    scratch, from_backbone = (plan.drafters[a, 0, "chat"].deps["init"] for a in ("dflash", "dflash-bb"))
    assert "backbone" not in scratch.deps and from_backbone.deps["backbone"] is plan.pretrain["plain"]
    assert from_backbone.deps["backbone"] is plan.drafters["osprey", 0, "chat"].deps["init"].deps["backbone"]
    # dflash drafts over the full vocabulary: [distill] draft_vocab is the chain drafters' only
    assert scratch.settings.draft_vocab is None and from_backbone.settings.draft_vocab is None
    assert plan.drafters["osprey", 0, "chat"].deps["init"].settings.draft_vocab == 128
    spec.write_text(text.replace("backbone = true\nstage2 = \"plain\"", "stage2 = \"plain\""))
    with pytest.raises(ConfigError, match="stage2 applies to arms with a backbone; this dflash arm"):
        load_study(spec)


def test_arms_with_their_own_pretrain_make_a_stage2_axis_and_share_equal_settings(spec):
    """Issue 34: a Stage-2 size axis. Each distinct pretrain table is one Stage 2 (its key and its
    report name carry the size); arms naming the same one share it; the shared [pretrain] keeps its key."""
    _, base = _keys(spec)
    text = spec.read_text()
    for name, steps in (("osprey-s1", 1), ("osprey-s4", 4), ("osprey-s4-wc", 4)):
        text += (f'\n[[arms]]\nname = "{name}"\narch = "osprey"\nstage2 = "plain"\npretrain = {{ steps = {steps} }}\n'
                 + ('arch_options = { w_c_init = "identity" }\n' if name.endswith("wc") else ""))
    spec.write_text(text)
    plan, keys = _keys(spec)
    assert all(keys[k] == v for k, v in base.items())            # nothing finished before moves
    backbone = {a: plan.drafters[a, 0, "chat"].deps["init"].deps["backbone"] for a in
                ("osprey", "osprey-s1", "osprey-s4", "osprey-s4-wc")}
    assert len({n.key for n in backbone.values()}) == 3 and backbone["osprey-s4"] is backbone["osprey-s4-wc"]
    assert backbone["osprey"] is plan.pretrain["plain"] and backbone["osprey-s1"].settings.steps == 1
    sizes = sorted(n for n in plan.pretrain if n.startswith("plain "))
    assert len(sizes) == 2 and all(plan.pretrain[n].label.endswith(" tokens)") for n in sizes)
    # a pretrain table on an arm without a Stage 2 is refused, naming the arm
    spec.write_text(text + '\n[[arms]]\nname = "e3"\narch = "eagle3"\nstage2 = "none"\npretrain = { steps = 2 }\n')
    with pytest.raises(ConfigError, match=r"#\d+ 'e3': pretrain applies to arms whose backbone has a Stage 2"):
        load_study(spec)
    spec.write_text(text.replace("pretrain = { steps = 1 }", "pretrain = { stepz = 1 }"))
    with pytest.raises(ConfigError, match=r"'osprey-s1' pretrain: unknown key 'stepz'"):
        load_study(spec)


def test_an_fp8_train_store_arm_gets_its_own_fp8_train_stores_and_shares_the_rest(spec):
    """train_data = "regenerated-fp8" (issue 33: what the fp8 store costs in acceptance): the same
    prompts regenerated into a store with fp8 hidden states, for that arm's training only."""
    _, base = _keys(spec)
    _edit(spec, '[[arms]]\nname = "osprey-kd"', '[[arms]]\nname = "eagle3-fp8"\narch = "eagle3"\nstage2 = "none"\n'
                                                'train_data = "regenerated-fp8"\n\n[[arms]]\nname = "osprey-kd"')
    plan, keys = _keys(spec)
    fp8 = [n for n in plan.nodes if n.kind == "store" and n.label.endswith("(fp8)")]
    assert sorted(n.label for n in fp8) == ["store chat train (fp8)", "store math train (fp8)"]
    assert all(n.settings_json()["hidden_codec"] == "fp8" and n.settings_json()["regenerate"] for n in fp8)
    drafter = plan.drafters["eagle3-fp8", 0, "chat"]
    assert drafter.deps["store"] in fp8
    # evaluated on the same (bf16) held-out stores as every other arm; nothing else changes key
    assert all(cell.deps["store"] is plan.cells["eagle3", 0, "chat", cell.eval_domain].deps["store"]
               for k, cell in plan.cells.items() if k[0] == "eagle3-fp8")
    assert {k: v for k, v in keys.items() if k in base} == base
