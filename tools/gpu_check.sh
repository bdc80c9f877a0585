#!/usr/bin/env bash
# gpu_check.sh: every GPU check in one offline run, on a machine with an NVIDIA GPU.
#
#   PY=python3 OUT=gpu-check bash tools/gpu_check.sh        (from the repository root)
#
# 1. the `gpu`-marked tests of the whole tests tree (tools/gpu_tests.py, what `make test-gpu`
#    runs: installs nothing, one line per present/absent package, this checkout first on
#    PYTHONPATH);
# 2. benchmarks/bench_gpu.py: copy paths and prefetcher overlap, Normalize, device
#    augmentation and nvJPEG rates, nvJPEG host syncs per batch.
# PY: the Python with a CUDA build of torch (default python3); PYTHONPATH may add packages
# that Python lacks (e.g. an unpacked simplejpeg wheel). Logs and the benchmark's JSON go to
# OUT. Each part has its own time limit (TESTS_TIMEOUT_S, BENCH_TIMEOUT_S; under 5 minutes
# together). GPU_TEST_ARGS replaces the test arguments (default "tests"; "--allow-cpu tests"
# is a dry run without CUDA). Exit status: 0 when both parts pass.
set -uo pipefail
PY=${PY:-python3}
OUT=${OUT:-gpu-check}
TESTS_TIMEOUT_S=${TESTS_TIMEOUT_S:-200}
BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-80}
mkdir -p "$OUT"
export PIP_NO_INDEX=1 PYTHONDONTWRITEBYTECODE=1
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2

echo "== pytest -m gpu over tests/ (limit ${TESTS_TIMEOUT_S} s; log $OUT/pytest-gpu.log)"
# shellcheck disable=SC2086 # GPU_TEST_ARGS: several words (pytest paths and options)
timeout --kill-after=10 "$TESTS_TIMEOUT_S" "$PY" tools/gpu_tests.py ${GPU_TEST_ARGS:-tests} \
  >"$OUT/pytest-gpu.log" 2>&1
tests_rc=$?
grep -E "^(python:|present:|absent:|torch |cannot run|running:)" "$OUT/pytest-gpu.log"
sed -n '/short test summary info/,$p' "$OUT/pytest-gpu.log" | head -60
tail -n 1 "$OUT/pytest-gpu.log"
[ "$tests_rc" = 124 ] || [ "$tests_rc" = 137 ] && echo "TIMEOUT: pytest -m gpu ran past ${TESTS_TIMEOUT_S} s"

echo "== benchmarks/bench_gpu.py (limit ${BENCH_TIMEOUT_S} s; log $OUT/bench_gpu.txt) [$((SECONDS - T0)) s]"
timeout --kill-after=10 "$BENCH_TIMEOUT_S" env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
  "$PY" benchmarks/bench_gpu.py --steps 30 --repeat 5 >"$OUT/bench_gpu.txt" 2>&1
bench_rc=$?
tail -n 25 "$OUT/bench_gpu.txt"
latest=$(ls -t benchmarks/results/runs/gpu-*.json 2>/dev/null | head -1)
[ -n "$latest" ] && cp "$latest" "$OUT/"

echo "== done in $((SECONDS - T0)) s: pytest rc=$tests_rc, bench_gpu rc=$bench_rc; logs in $OUT/"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
