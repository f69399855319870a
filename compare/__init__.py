"""Policies × inference methods on the same problems: do step-PPO and verify-then-revise help,
separately and together, and at what cost?

    python scripts/compare.py [--config configs/compare/tiny_world.yaml] --out DIR [--quick]
        [--n_problems N] [--cache_dir D] [--workers W] [--set section.key=value ...]

1. **Artefacts**, trained or reused: the SFT policy (`rl.sft`, with the revise, clarify and verify
   tasks that StepCo and BEATS prompt for), the PSV (StepCo-tree annotation of the SFT policy's
   paths, then `reward_models.train`), and one PPO policy per entry of `ppo.runs` (outcome- and
   step-PPO by default, `rl/ppo_step.py`, the same budget for both). Each lives in
   `<cache_dir>/<kind>-<hash>/`, the hash taken over the config entries that define it and the
   hashes of what it is built from; a directory with its `compare_artefact.json` marker is reused,
   one without it is resumed (annotation, PPO checkpoints) or rebuilt (SFT). A config entry `path`
   uses an existing policy or verifier instead (a Hub model on GPUs).
2. **Evaluation**: every policy with every method of `eval.methods` (greedy, self-consistency,
   Best-of-N, StepCo, BEATS) through `inference.evaluate.evaluate`, on the same problems, with the
   same seeds and the same verifier, into `DIR/eval/<policy>/<method>/` (resumable per chunk).
   Optionally StepCo with the world's exact checker, labelled as an upper reference.
3. **Report**: `DIR/report.md`, `DIR/summary.json` and `DIR/accuracy_vs_tokens.png`: accuracy
   with its 95% bootstrap interval, generator and verifier tokens, LLM calls and wall time per
   cell; paired effects (PPO vs SFT, StepCo vs greedy, both together); StepCo's answer changes
   between its initial path and its final answer (StepCo's Figure 4); accuracy against tokens for
   self-consistency and Best-of-N at N = 1, 2, 4, ... (read from one run at the largest N),
   StepCo at T = 1..max_rounds (read from one run's per-round trace) and BEATS.

`--quick` merges `configs/compare/quick.yaml` over the config: a smoke run of every stage.
With `workers` > 1 the two PPO runs, then the per-policy evaluations, run as parallel
subprocesses (logs in `DIR/logs/`). Progress goes to stderr; nothing is lost on a kill: a re-run
with the same `--out` resumes every stage.

The package, one module per concern, each usable alone: `config` (schema, loading, validation),
`cache` (artefact keys and directories), `train` (building the artefacts), `jobs` (running stages
side by side), `evaluation` (policies × methods), `calibration` (StepCo's θ), `curves` (accuracy
against tokens from the traces), `analysis` (cells, paired effects, answer changes), `report`,
`plot`, `pipeline` (the run and the plan) and `cli`. `scripts/compare.py` is the entry point.
Nothing else in the toolkit imports this package; it imports every other.
"""
