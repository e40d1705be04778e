#!/usr/bin/env bash
# Everything GPU-only, in one go, on one H100 / H200 machine without network: see bench/gpu/README.md.
#
#   OUT=/some/folder bash bench/gpu/check.sh            # installs from bench/gpu/wheels/, then the parts below
#   bash bench/gpu/check.sh --dry-run                   # anywhere (CI, a laptop): checks what it can, exits 0
#
# Parts, each bounded by its own time limit and all of them by TOTAL_S (so a hang still leaves the JSON):
#   wheels   bench/gpu/wheels/: present, complete, and small enough to travel (the working tree that goes to the GPU
#            machine, wheels included, must stay under 64 MiB)
#   install  the missing packages from the wheels (--no-index), the tested versions (constraints-cpu.txt) of those
#            bench/gpu/versions.py verifies (transformers, tokenizers, huggingface_hub, Lightning...), then
#            `pip install --no-deps -e .` of hf_lightning
#   versions bench/gpu/versions.py: the installed versions against constraints-cpu.txt, written to check.json; when
#            one differs the check REFUSES: pytest and the bench do not run, check.json says which and exits 1
#   pytest   `pytest -m gpu` over the test files with gpu-marked tests (precision, FSDP1, FSDP2, DeepSpeed ZeRO-2/3
#            scenarios resumed exactly, best-model loads, uneven evaluation, the memory plan within 15% of
#            torch.cuda.max_memory_allocated for BERT / GPT-2 / T5, full and LoRA, fp32 and bf16-mixed, in
#            tests/test_memory_plan.py...); DeepSpeed's are deselected, with the reason in the JSON, when its wheel
#            is missing or does not import
#   bench    bench/gpu/bench_throughput.py: GPT-2 124M, a ~1B Llama, LoRA on it; tokens/s, MFU, peak memory of
#            hf_lightning, transformers.Trainer and a hand-written loop, with the targets
# Written to $OUT (default bench/gpu/out/): check.json (the results), check.log (everything printed), pytest.xml,
# bench.json.
#
# --dry-run: builds and prints every command, checks the wheel folder (a missing folder is reported, not fatal: a
# clean checkout has none), verifies this machine's versions, collects the gpu tests (`--collect-only`), and runs the
# bench on tiny models on the CPU for 3 updates (`--tiny-cpu`). No install, no GPU. Exit status 0 unless one of those
# checks fails. HF_LIGHTNING_GPU_FAKE_VERSIONS="transformers=5.17.0" simulates an image's versions (refused).
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT="${OUT:-$HERE/out}"
mkdir -p "$OUT"
rm -f "$OUT/versions.json" "$OUT/pytest.xml" "$OUT/bench.json" "$OUT/check.json"   # no figure of an earlier run
LOG="$OUT/check.log"
PARTS="$OUT/parts.jsonl"
: > "$LOG"
: > "$PARTS"
PY="${PYTHON:-python3}"
WHEELS="${HF_LIGHTNING_GPU_WHEELS:-$HERE/wheels}"   # another folder: tests/test_gpu_check.py
TREE_LIMIT_MIB=64
TOTAL_S="${TOTAL_S:-530}"   # 8 min 50 s: the 9-minute budget, installs included
START=$(date +%s)

log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
note_part() {  # name rc seconds note
  "$PY" -c 'import json,sys; print(json.dumps({"part": sys.argv[1], "rc": int(sys.argv[2]), "seconds": int(sys.argv[3]), "note": sys.argv[4]}))' \
    "$1" "$2" "$3" "$4" >> "$PARTS"
}
run_part() {  # name limit_s command... : bounded by the part's limit and by what is left of TOTAL_S
  local name=$1 limit=$2; shift 2
  local left=$(( TOTAL_S - ($(date +%s) - START) ))
  if [ "$DRY" = 0 ] && [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -le 5 ]; then
    log "== $name: skipped, the total time budget (${TOTAL_S}s) is spent"
    note_part "$name" 124 0 "skipped: no time left of TOTAL_S=${TOTAL_S}s"
    return 124
  fi
  log "== $name (at most ${limit}s): $*"
  local s=$(date +%s)
  timeout --kill-after=15 "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - s ))
  local why=""
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && why="timed out after ${limit}s"
  log "== $name: rc=$rc in ${took}s ${why}"
  note_part "$name" "$rc" "$took" "$why"
  return $rc
}

log "hf_lightning GPU check, dry_run=$DRY, repo $REPO, OUT=$OUT"

# ---- wheels -------------------------------------------------------------------------------------------------------
REQUIRED=(datasets dill multiprocess fsspec jsonargparse docstring_parser typeshed_client torchdata hjson pydantic
          pydantic_core annotated_types typing_inspection typing_extensions deepspeed
          tokenizers huggingface_hub httpx2 httpcore2 truststore hf_xet click anyio idna h11 peft lightning
          lightning_utilities)
PACKED=(pyarrow transformers)   # stored unpacked as <name>.tar.xz + <name>.wheel-name (xz packs them far smaller)
WHEELS_NOTE=""
WHEELS_MIB=0
TREE_MIB=$(cd "$REPO" && git ls-files -z 2>/dev/null | xargs -0 du -cb 2>/dev/null | tail -1 | awk '{printf "%.1f", $1/1048576}')
if [ ! -d "$WHEELS" ]; then
  WHEELS_NOTE="missing: bench/gpu/wheels/ does not exist (a clean checkout has none; run bash bench/gpu/fetch_wheels.sh, see bench/gpu/README.md)"
  log "wheels: $WHEELS_NOTE"
else
  WHEELS_MIB=$(du -sb "$WHEELS" | awk '{printf "%.1f", $1/1048576}')
  MISSING=()
  for name in "${REQUIRED[@]}"; do
    ls "$WHEELS"/${name}-*.whl >/dev/null 2>&1 || MISSING+=("$name")
  done
  for name in "${PACKED[@]}"; do
    [ -f "$WHEELS/$name.tar.xz" ] && [ -f "$WHEELS/$name.wheel-name" ] || MISSING+=("$name.tar.xz")
  done
  OVER=$("$PY" -c "print(int($WHEELS_MIB + ${TREE_MIB:-0} > $TREE_LIMIT_MIB))")
  [ ${#MISSING[@]} -gt 0 ] && WHEELS_NOTE="incomplete, missing: ${MISSING[*]}"
  [ "$OVER" = 1 ] && WHEELS_NOTE="$WHEELS_NOTE too large: wheels ${WHEELS_MIB} MiB + tracked files ${TREE_MIB} MiB > ${TREE_LIMIT_MIB} MiB"
  log "wheels: ${WHEELS_MIB} MiB in bench/gpu/wheels, tracked files ${TREE_MIB} MiB (limit ${TREE_LIMIT_MIB} MiB together) ${WHEELS_NOTE}"
fi
note_part wheels 0 0 "${WHEELS_MIB} MiB wheels + ${TREE_MIB} MiB tracked files (limit ${TREE_LIMIT_MIB} MiB); ${WHEELS_NOTE:-complete}"

# ---- install ------------------------------------------------------------------------------------------------------
DS_SKIP=""
[ -d "$WHEELS" ] && ls "$WHEELS"/deepspeed-*.whl >/dev/null 2>&1 || DS_SKIP="no deepspeed wheel in bench/gpu/wheels (fetch_wheels.sh builds it from PyPI's source tarball)"
# DeepSpeed: no op compiled at install; CUDA even if it cannot tell (not in a dry run: no GPU there)
[ "$DRY" = 0 ] && export DS_BUILD_OPS=0 DS_ACCELERATOR=cuda
install() {
  set -e
  local found
  found="$(mktemp -d)"
  cp "$WHEELS"/*.whl "$found"/
  local packed=(transformers)
  # pyarrow: only when the image's does not satisfy datasets' pyarrow>=24
  "$PY" -c 'import pyarrow, sys; sys.exit(int(pyarrow.__version__.split(".")[0]) < 24)' 2>/dev/null || packed+=(pyarrow)
  for name in "${packed[@]}"; do  # each wheel zipped back from its archive
    rm -rf "$found/x" && mkdir "$found/x" && tar -C "$found/x" -xJf "$WHEELS/$name.tar.xz"
    "$PY" - "$found/x" "$found/$(cat "$WHEELS/$name.wheel-name")" <<'PYEOF'
import os, sys, zipfile
root, target = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as z:  # the same files as the original wheel: RECORD holds
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            z.write(path, os.path.relpath(path, root))
PYEOF
  done
  rm -rf "$found/x"
  # the tested versions of what versions.py verifies (its pins alone: the whole constraints file would also pin torch
  # and the image's numpy... to versions that cannot travel); what the image already has at that version stays
  local wanted=(transformers tokenizers huggingface_hub accelerate lightning lightning-utilities torchmetrics
                safetensors peft datasets "jsonargparse[signatures]" torchdata)
  [ -z "$DS_SKIP" ] && wanted+=(deepspeed)
  "$PY" "$REPO/bench/gpu/versions.py" --json "$found/before.json" --constraints-out "$found/constraints-gpu.txt" || true
  "$PY" -m pip install --no-index --find-links "$found" --no-build-isolation -c "$found/constraints-gpu.txt" \
    "${wanted[@]}"
  "$PY" -m pip install --no-deps --no-build-isolation -e "$REPO"
}
if [ "$DRY" = 1 ]; then
  log "install (dry run, not run): pip install --no-index --find-links bench/gpu/wheels --no-build-isolation -c <versions.py's pins> transformers tokenizers huggingface_hub accelerate lightning lightning-utilities torchmetrics safetensors peft datasets 'jsonargparse[signatures]' torchdata deepspeed; pip install --no-deps --no-build-isolation -e ."
  note_part install 0 0 "dry run: not run"
elif [ ! -d "$WHEELS" ]; then
  log "install: skipped, $WHEELS_NOTE"
  note_part install 1 0 "skipped: $WHEELS_NOTE"
else
  run_part install 90 bash -c "$(declare -f install); PY='$PY' WHEELS='$WHEELS' REPO='$REPO' DS_SKIP='$DS_SKIP' install" \
    || log "install failed: the parts below run with what is installed"
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"   # the checkout wins, installed or not
if [ -z "$DS_SKIP" ] && [ "$DRY" = 0 ] && ! "$PY" -c "import deepspeed" >> "$LOG" 2>&1; then
  DS_SKIP="deepspeed does not import after the install (see check.log)"
fi
[ -n "$DS_SKIP" ] && log "DeepSpeed scenarios deselected: $DS_SKIP"

# ---- versions -----------------------------------------------------------------------------------------------------
VERSIONS_ARGS=(--json "$OUT/versions.json")
[ -n "$DS_SKIP" ] && VERSIONS_ARGS+=(--without deepspeed)
REFUSED=""
if ! run_part versions 60 "$PY" "$REPO/bench/gpu/versions.py" "${VERSIONS_ARGS[@]}"; then
  DIFFER=$("$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); print("; ".join(r["differ"] + r["unpinned"]))' \
    "$OUT/versions.json" 2>/dev/null)
  REFUSED="versions differ from constraints-cpu.txt: ${DIFFER:-see check.log}; no parity figure reported"
  log "REFUSED: $REFUSED"
fi

# ---- pytest -m gpu ------------------------------------------------------------------------------------------------
cd "$REPO" || exit 1
GPU_FILES=$(grep -l "mark.gpu" tests/test_*.py | tr '\n' ' ')
SELECT=(-m gpu)
[ -n "$DS_SKIP" ] && SELECT=(-m gpu -k "not zero and not deepspeed")
WORKERS=()
"$PY" -c "import xdist" 2>/dev/null && WORKERS=(-n 4)   # tiny models: 4 scenarios share the GPU
if [ -n "$REFUSED" ]; then
  note_part pytest 1 0 "refused: $REFUSED"
  PYTEST_RC=1
elif [ "$DRY" = 1 ]; then
  log "pytest (dry run): python -m pytest ${SELECT[*]} ${WORKERS[*]} -q -rfEs --junitxml=$OUT/pytest.xml $GPU_FILES"
  run_part pytest-collect 300 "$PY" -m pytest "${SELECT[@]}" --collect-only -q -p no:cacheprovider $GPU_FILES
  PYTEST_RC=$?
else
  run_part pytest 300 "$PY" -m pytest "${SELECT[@]}" "${WORKERS[@]}" -q -rfEs -p no:cacheprovider \
    --junitxml="$OUT/pytest.xml" $GPU_FILES
  PYTEST_RC=$?
fi

# ---- throughput bench ---------------------------------------------------------------------------------------------
if [ -n "$REFUSED" ]; then
  note_part bench 1 0 "refused: $REFUSED"
  BENCH_RC=1
elif [ "$DRY" = 1 ]; then
  log "bench (dry run): python bench/gpu/bench_throughput.py --json $OUT/bench.json  (run now: --tiny-cpu)"
  run_part bench-tiny-cpu 300 "$PY" bench/gpu/bench_throughput.py --tiny-cpu --json "$OUT/bench.json"
  BENCH_RC=$?
else
  run_part bench 170 "$PY" bench/gpu/bench_throughput.py --json "$OUT/bench.json"
  BENCH_RC=$?
fi

# ---- the JSON -----------------------------------------------------------------------------------------------------
"$PY" - "$OUT" "$DRY" "$DS_SKIP" "$(( $(date +%s) - START ))" "$REFUSED" <<'PYEOF' | tee -a "$LOG"
import json, os, subprocess, sys
import xml.etree.ElementTree as ET

out, dry, ds_skip, seconds, refused = sys.argv[1], sys.argv[2] == "1", sys.argv[3], int(sys.argv[4]), sys.argv[5]
parts = [json.loads(line) for line in open(os.path.join(out, "parts.jsonl"))]
result = {"dry_run": dry, "seconds": seconds, "deepspeed_skipped": ds_skip or None, "refused": refused or None,
          "parts": parts}
versions = os.path.join(out, "versions.json")
if os.path.exists(versions):
    result["versions"] = json.load(open(versions))
try:
    import torch
    result["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    result["torch"] = torch.__version__
except Exception as error:  # noqa: BLE001 - reported, not raised
    result["device"] = f"torch does not import: {error}"
junit = os.path.join(out, "pytest.xml")
if os.path.exists(junit) and not refused:
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    cases = suite.findall("testcase")
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in cases
              if c.find("failure") is not None or c.find("error") is not None]
    result["pytest"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    result["pytest"]["failed"] = failed
bench = os.path.join(out, "bench.json")
if os.path.exists(bench) and not refused:  # figures from untested versions are not reported
    data = json.load(open(bench))
    result["bench"] = {"device": data["device"], "tiny_cpu": data["tiny_cpu"],
                       "cases": [{k: c[k] for k in ("case", "median", "ratios", "targets", "targets_met")}
                                 for c in data["cases"]]}
result["ok"] = all(p["rc"] == 0 for p in parts)
with open(os.path.join(out, "check.json"), "w") as f:
    json.dump(result, f, indent=2)
print(json.dumps({k: result[k] for k in ("dry_run", "ok", "seconds", "deepspeed_skipped", "refused", "parts")},
                 indent=1))
PYEOF

if [ "$DRY" = 1 ]; then
  [ "$PYTEST_RC" = 0 ] && [ "$BENCH_RC" = 0 ] && exit 0
  exit 1
fi
[ "$PYTEST_RC" = 0 ] && [ "$BENCH_RC" = 0 ]
