#!/usr/bin/env bash
# The set-up as a user meets it: a fresh clone of this repository's HEAD (committed work only) in a
# scratch folder, README command 1's set-up with pip's settings switched off (PIP_CONFIG_FILE=/dev/null,
# no find-links, no extra index: PyPI only; the machine's certificate bundle, PIP_CERT, kept), then a
# 2-update smoke of the main job (README command 1 with --max_steps 2, its SFT policy built first as
# a user's is), `--help` of every console script, and every README command in the order a reader
# meets them (scripts/readme_walkthrough.py, long jobs cut, on the policy the main job built). With
# --tests, README command 2 (the whole suite) runs there too. Prints one line per phase with its
# seconds and a summary; exits 1 on the first phase that fails.
#
#   bash scripts/check_fresh_install.sh [--tests] [--keep] [--pip-settings] [DIR]
#
# --keep leaves the scratch folder (default: removed at the end, several GB); --pip-settings keeps
# this machine's pip settings (a local wheel, an extra index) to check that case instead; DIR is the
# scratch folder (default: a new one under ${TMPDIR:-/tmp}).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TESTS=0 KEEP=0 PIP_SETTINGS=0 DIR=""
for arg in "$@"; do
  case "$arg" in
    --tests) TESTS=1 ;;
    --keep) KEEP=1 ;;
    --pip-settings) PIP_SETTINGS=1 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check_fresh_install: unknown option $arg (--tests, --keep, --pip-settings, DIR)" >&2; exit 2 ;;
    *) DIR=$arg ;;
  esac
done
DIR=${DIR:-$(mktemp -d "${TMPDIR:-/tmp}/steprl-fresh.XXXXXX")}
mkdir -p "$DIR"
CLONE="$DIR/steprl"
LOG="$DIR/log"
mkdir -p "$LOG"
cleanup() { if [ "$KEEP" = 0 ]; then rm -rf "$CLONE"; fi; }
trap cleanup EXIT

# The environment a user's shell has: no pip settings (unless --pip-settings), no project variables.
# The interpreter itself, not a shim that reads HOME (pyenv's): the scratch HOME has no caches.
PYTHON=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
ENV=(env -i "HOME=$DIR/home" "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
     "PYTHON=$PYTHON" "LANG=${LANG:-C.UTF-8}" "TMPDIR=${TMPDIR:-/tmp}" "PIP_NO_INPUT=1")
[ -n "${PIP_CERT:-}" ] && ENV+=("PIP_CERT=$PIP_CERT")
if [ "$PIP_SETTINGS" = 0 ]; then
  ENV+=("PIP_CONFIG_FILE=/dev/null")
else
  for v in $(compgen -e | grep '^PIP_' || true); do ENV+=("$v=${!v}"); done
fi
[ -n "${CI:-}" ] && ENV+=("CI=$CI")
mkdir -p "$DIR/home"

phase() {  # phase NAME COMMAND...: runs in the clone, logs to $LOG/NAME.log, prints its seconds
  local name=$1 start rc; shift
  start=$(date +%s)
  set +e
  (cd "$CLONE" && "${ENV[@]}" "$@") >"$LOG/$name.log" 2>&1
  rc=$?
  set -e
  printf 'check_fresh_install: %-14s rc %d  %5d s  (log %s)\n' "$name" "$rc" "$(( $(date +%s) - start ))" "$LOG/$name.log"
  if [ "$rc" != 0 ]; then
    tail -n 20 "$LOG/$name.log" | sed 's/^/  | /'
    exit 1
  fi
}

git clone -q "$ROOT" "$CLONE"
echo "check_fresh_install: $(git -C "$CLONE" rev-parse --short HEAD) cloned to $CLONE; pip settings: $([ "$PIP_SETTINGS" = 0 ] && echo 'none (PyPI only)' || echo "this machine's")"
phase setup bash scripts/setup_env.sh
grep '^setup: ' "$LOG/setup.log" | sed 's/^/  /' || true
echo "  .venv: $(du -sh "$CLONE/.venv" | cut -f1); torch $("$CLONE/.venv/bin/python" -c 'import torch; print(torch.__version__)')"
phase main_job .venv/bin/steprl-ppo --max_steps 2
tail -n 3 "$LOG/main_job.log" | sed 's/^/  /'
test -s "$CLONE/outputs/ppo_step/eval.json" || { echo "check_fresh_install: main_job wrote no outputs/ppo_step/eval.json" >&2; exit 1; }
scripts=$(awk '/^\[/{on = ($0 == "[project.scripts]")} on && /^steprl-/{print $1}' "$CLONE/pyproject.toml" | tr '\n' ' ')
phase console_scripts bash -c 'for s in '"$scripts"'; do .venv/bin/$s --help >/dev/null || { echo "$s --help failed"; exit 1; }; echo "$s ok"; done'
echo "  $(grep -c ' ok$' "$LOG/console_scripts.log") console scripts answer --help"
phase readme .venv/bin/python scripts/readme_walkthrough.py --policy outputs/sft_tiny
tail -n 1 "$LOG/readme.log" | sed 's/^/  /'
if [ "$TESTS" = 1 ]; then
  phase tests bash scripts/test.sh
  tail -n 1 "$LOG/tests.log" | sed 's/^/  /'
fi
echo "check_fresh_install: passed"
