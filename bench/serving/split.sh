#!/bin/bash
# A model split over 1, 2 and 3 real meshnode processes, served through the first one's HTTP API
# and driven by bench/serving/load.py (1, 4 and 16 streams): tokens/s, time to first token and
# inter-token latency per split, on loopback or over shaped links between network namespaces.
#
# usage: bash bench/serving/split.sh MODEL.gguf
# Environment:
#   LINK       loopback (default) or shaped: each node in a network namespace of its own behind a
#              veth on one bridge, its egress shaped by netem to DELAY_MS (1) and RATE (1gbit), so
#              that every node-to-node link is RATE with DELAY_MS each way. Needs root.
#   SPLITS     the splits to measure (default "1 2 3"); 1 is the whole model on the first node
#   STREAMS    load.py's levels (default 1,4,16); REQUESTS per stream (2); MAX_TOKENS (64);
#              PROMPT_WORDS (50)
#   NP         --parallel of the nodes (default 16); CONTEXT per sequence (default 1024)
#   DEVICE     the nodes' --device (default auto); BIN: where meshnode and meshctl are
#              (default build/release/apps); OUT: results folder (default /tmp/split-bench)
# Results: $OUT/results.jsonl (a line per split and level, label "split N"), nodes' logs.
set -u -o pipefail
MODEL=${1:?usage: split.sh MODEL.gguf}
LINK=${LINK:-loopback} DELAY_MS=${DELAY_MS:-1} RATE=${RATE:-1gbit}
SPLITS=${SPLITS:-1 2 3} STREAMS=${STREAMS:-1,4,16} REQUESTS=${REQUESTS:-2} MAX_TOKENS=${MAX_TOKENS:-64}
PROMPT_WORDS=${PROMPT_WORDS:-50} NP=${NP:-16} CONTEXT=${CONTEXT:-1024} DEVICE=${DEVICE:-auto}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/build/release/apps}
O=${OUT:-/tmp/split-bench}
T0=$SECONDS
log() { printf '[split %4ds] %s\n' $((SECONDS - T0)) "$*"; }
rm -rf "$O" && mkdir -p "$O"
exec > >(tee -a "$O/split.log") 2>&1
[ -x "$BIN/meshnode" ] && [ -x "$BIN/meshctl" ] || { log "no meshnode/meshctl in $BIN"; exit 2; }
MODEL=$(readlink -f "$MODEL")
NS=mnbench$$
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  if [ "$LINK" = shaped ]; then for n in a b c br; do ip netns del "$NS$n" 2>/dev/null; done; fi
}
trap cleanup EXIT

# in NODE CMD...: runs CMD where node NODE (a, b, c) lives.
in() {
  local n=$1; shift
  if [ "$LINK" = shaped ]; then ip netns exec "$NS$n" "$@"; else "$@"; fi
}
addr_of() { if [ "$LINK" = shaped ]; then echo "10.77.0.$1"; else echo 127.0.0.1; fi; }

if [ "$LINK" = shaped ]; then
  ip netns add "${NS}br" && ip -n "${NS}br" link add br0 type bridge && ip -n "${NS}br" link set br0 up || exit 1
  i=1
  for n in a b c; do
    ip netns add "$NS$n"
    ip link add "v$NS$n" type veth peer name eth0 netns "$NS$n"
    ip link set "v$NS$n" netns "${NS}br"
    ip -n "${NS}br" link set "v$NS$n" master br0 up
    ip -n "$NS$n" addr add "10.77.0.$i/24" dev eth0
    ip -n "$NS$n" link set eth0 up
    ip -n "$NS$n" link set lo up
    ip netns exec "$NS$n" tc qdisc add dev eth0 root netem delay "${DELAY_MS}ms" rate "$RATE" limit 100000
    i=$((i + 1))
  done
  log "shaped links: netem delay ${DELAY_MS}ms rate $RATE on each node's egress; ping a -> b:"
  in a ping -c 3 -q 10.77.0.2 | tail -1
fi

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$O/secret"
start_node() {  # start_node NAME INDEX EXTRA...
  local n=$1 i=$2; shift 2
  in "$n" "$BIN/meshnode" --state-dir "$O/$n" --secret-file "$O/secret" --mdns off --device "$DEVICE" \
    --bind "$(addr_of "$i")" --port $((7100 + i)) --parallel "$NP" "$@" >"$O/$n.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 300); do [ -s "$O/$n/endpoint" ] && return 0; sleep 0.1; done
  log "node $n did not start"; tail -20 "$O/$n.log"; exit 1
}
start_node a 1 --api-bind 127.0.0.1:8101
EA=$(cat "$O/a/endpoint")
start_node b 2 --api-bind off --peer "$EA"
start_node c 3 --api-bind off --peer "$EA"
URL=http://127.0.0.1:8101
api() { in a python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" "$URL$1"; }
for _ in $(seq 150); do
  healthy=$(api /api/mesh 2>/dev/null | python3 -c "import json,sys; print(sum(n['health']=='healthy' for n in json.load(sys.stdin)['nodes']))" 2>/dev/null)
  [ "${healthy:-0}" -ge 2 ] && break
  sleep 0.2
done
log "node a sees ${healthy:-0} healthy peers; device: $(grep -m1 -io 'device[^,]*' "$O/a.log" || true)"

for s in $SPLITS; do
  id=split$s
  ln -sf "$MODEL" "$O/$id.gguf"
  if [ "$s" = 1 ]; then
    out=$(in a "$BIN/meshctl" --state-dir "$O/a" models load "$O/$id.gguf" --context "$CONTEXT" 2>&1)
  else
    out=$(in a "$BIN/meshctl" --state-dir "$O/a" models load "$O/$id.gguf" --context "$CONTEXT" --split "$s" 2>&1)
  fi
  rc=$?
  log "load $id: $(echo "$out" | tail -1)"
  [ $rc = 0 ] || continue
  in a "$BIN/meshctl" --state-dir "$O/a" models | grep "$id"
  in a python3 "$ROOT/bench/serving/load.py" --url "$URL" --model "$id" --streams "$STREAMS" --requests "$REQUESTS" \
    --max-tokens "$MAX_TOKENS" --prompt-words "$PROMPT_WORDS" --label "split $s" --json "$O/results.jsonl"
  in a "$BIN/meshctl" --state-dir "$O/a" models unload "$id" >/dev/null 2>&1
done

# The added latency per hop: each remote stage costs a round trip per token (the serving node
# sends it the rows and waits for its answer), so (ITL p50 of split N - split 1) / (N - 1) is the
# cost of one remote stage per token at one stream.
python3 - "$O/results.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
one = {r["label"]: r for r in rows if r["streams"] == 1}
base = one.get("split 1")
print(f"{'split':<8} {'streams':>7} {'tok/s':>8} {'vs split 1':>10} {'TTFT p50':>9} {'ITL p50':>8}")
for r in rows:
    ref = next((x for x in rows if x["label"] == "split 1" and x["streams"] == r["streams"]), None)
    ratio = f"{100 * r['tokens_per_s'] / ref['tokens_per_s']:.0f}%" if ref and ref["tokens_per_s"] else "-"
    print(f"{r['label']:<8} {r['streams']:>7} {r['tokens_per_s']:>8.1f} {ratio:>10} {r['ttft_p50_s']:>8.3f}s {r['itl_p50_ms']:>6.1f}ms")
if base:
    for label, r in sorted(one.items()):
        n = int(label.split()[1])
        if n > 1:
            print(f"{label}: {(r['itl_p50_ms'] - base['itl_p50_ms']) / (n - 1):.2f} ms added per remote stage per token (1 stream)")
EOF
log done
