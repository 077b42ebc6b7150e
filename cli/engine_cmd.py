"""``osprey eval engine``: a drafter served by a real engine (vLLM or SGLang), its counters beside ours."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["engine"]


@click.command("engine")
@click.option("--engine", "engine_name", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True,
              help="Serving engine, run from its own venv: engines/setup_vllm.sh, .ci/sglang_venv.sh (SGLang's CPU "
                   "rig; on CUDA PyPI sglang).")
@click.option("--drafter", required=True, type=click.Path(path_type=Path), help="Drafter folder (Osprey or EAGLE-3).")
@click.option("--target", required=True, help="Target HF folder (the drafter's target).")
@click.option("--input", "inputs", required=True, multiple=True, help="Prompt file(s); every prompt is decoded.")
@click.option("--steps", type=int, default=3, show_default=True, help="Draft tokens per verify round.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True, help="Tokens per prompt at most.")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Run folder: export/, store/, engine/ (request, log, result), report.md, report.json.")
@click.option("--export", "exports", multiple=True, type=click.Path(path_type=Path),
              help="Check this export of --drafter (the engine's format, made elsewhere) instead of exporting now; "
                   "repeatable.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="Engine dtype (ours follows): float32 for parity, bfloat16 for speed; auto = float32, bfloat16 "
                   "for SGLang on CPU (its only dtype there).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="SGLang's device (auto: cuda where present, else its CPU engine).")
@click.option("--threads", type=int, default=1, show_default=True, help="CPU threads (engine and ours).")
@click.option("--no-live", is_flag=True, help="Skip our live harness.")
@click.option("--venv", default=None,
              help="The engine's venv [default: $OSPREY_VLLM_VENV or .venv-vllm, $OSPREY_SGLANG_VENV or .venv-sglang].")
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of report.md.")
def engine(engine_name: str, drafter: Path, target: str, inputs: tuple[str, ...], steps: int, max_new_tokens: int,
           out: Path, exports: tuple[Path, ...], dtype: str, device: str, threads: int, no_live: bool,
           venv: str | None, as_json: bool) -> None:
    """Serve the drafter in an engine: its own counters vs Osprey's offline and live figures.

    Exit code 1 when the engine's per-position counts, rounds or greedy outputs disagree with ours, or when
    its speculative output is not its plain output (not lossless: SGLang's CPU engine at the rig's snapshot).

    \b
    Example:
      engines/setup_vllm.sh
      osprey eval engine --engine vllm --drafter runs/eagle3/final --target MODEL --input prompts.jsonl \\
          --steps 3 --out runs/engine-check
      .ci/sglang_venv.sh
      osprey eval engine --engine sglang --drafter runs/osprey/final --target MODEL --input prompts.jsonl \\
          --steps 3 --out runs/engine-sglang
    """
    import json

    from osprey_train.engines.engine_eval import EngineEvalConfig, run

    report = run(EngineEvalConfig(engine=engine_name, drafter=drafter, target=target, inputs=inputs, steps=steps,
                                  max_new_tokens=max_new_tokens, out=out, exports=exports, dtype=dtype, device=device,
                                  threads=threads, live=not no_live, venv=venv))
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.to_markdown())
    if not report.agrees:
        raise SystemExit(1)
