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
#              PROMPT_WORDS (50); ROUNDS (1): every level this many times (load.py --rounds)
#   NP         --parallel of the nodes (default 16); CONTEXT per sequence (default 1024)
#   DEVICE     the nodes' --device (default auto); DEVICES: one per node a, b, c instead (e.g.
#              "#0 #1 #0": two GPUs of one host); BIN: where meshnode and meshctl are
#              (default build/release/apps); OUT: results folder (default /tmp/split-bench)
#   DELAY_LINE mesh-delay-line (default build/release/bench/serving/), for kernels without
#              sch_netem: then tbf shapes the rate and an iptables NFQUEUE rule per node hands
#              its packets to mesh-delay-line, which holds each for DELAY_MS
# Results: $OUT/results.jsonl (a line per split and level, label "split N"), nodes' logs.
set -u -o pipefail
MODEL=${1:?usage: split.sh MODEL.gguf}
LINK=${LINK:-loopback} DELAY_MS=${DELAY_MS:-1} RATE=${RATE:-1gbit}
SPLITS=${SPLITS:-1 2 3} STREAMS=${STREAMS:-1,4,16} REQUESTS=${REQUESTS:-2} MAX_TOKENS=${MAX_TOKENS:-64}
PROMPT_WORDS=${PROMPT_WORDS:-50} ROUNDS=${ROUNDS:-1} NP=${NP:-16} CONTEXT=${CONTEXT:-1024} DEVICE=${DEVICE:-auto}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/build/release/apps}
DELAY_LINE=${DELAY_LINE:-$ROOT/build/release/bench/serving/mesh-delay-line}
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
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done  # not a bare wait: tee below is a child too
  if [ "$LINK" = shaped ]; then for n in a b c br; do ip netns del "$NS$n" 2>/dev/null; done; fi
}
trap cleanup EXIT
trap "exit 1" INT TERM  # exit runs cleanup

# on_node NODE CMD...: runs CMD where node NODE (a, b, c) lives.
on_node() {
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
    if ip netns exec "$NS$n" tc qdisc add dev eth0 root netem delay "${DELAY_MS}ms" rate "$RATE" limit 100000 2>/dev/null; then
      SHAPER="netem delay ${DELAY_MS}ms rate $RATE"
    else
      # No sch_netem in this kernel: tbf for the rate, and an NFQUEUE rule whose verdicts
      # mesh-delay-line holds for DELAY_MS (tests/common/kernel_delay_line.hpp).
      ip netns exec "$NS$n" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 50ms || exit 1
      ip netns exec "$NS$n" iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num $((40 + i)) || exit 1
      "$DELAY_LINE" "$NS$n" $((40 + i)) "$DELAY_MS" >"$O/delay-$n.log" 2>&1 &
      PIDS+=($!)
      SHAPER="tbf rate $RATE + NFQUEUE delay ${DELAY_MS}ms (mesh-delay-line)"
    fi
    i=$((i + 1))
  done
  sleep 0.5
  # A TCP connect to a closed port (SYN out, RST back) takes one round trip.
  rtt=$(on_node a python3 -c '
import socket, time
ts = []
for _ in range(7):
    c = socket.socket(); c.settimeout(2); t = time.perf_counter()
    try: c.connect(("10.77.0.2", 9))
    except OSError: pass
    ts.append(1e3 * (time.perf_counter() - t)); c.close()
print(f"{sorted(ts)[3]:.2f}")')
  log "shaped links: $SHAPER on each node's egress; round trip a -> b: $rtt ms (median of 7)"
fi

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$O/secret"
chmod 600 "$O/secret"
read -r -a DEVS <<<"${DEVICES:-$DEVICE $DEVICE $DEVICE}"
start_node() {  # start_node NAME INDEX EXTRA...
  local n=$1 i=$2; shift 2
  local cmd=("$BIN/meshnode" --state-dir "$O/$n" --secret-file "$O/secret" --mdns off --device "${DEVS[$((i - 1))]:-$DEVICE}"
    --bind "$(addr_of "$i")" --port $((7100 + i)) --parallel "$NP" "$@")
  [ "$LINK" = shaped ] && cmd=(ip netns exec "$NS$n" "${cmd[@]}")
  "${cmd[@]}" >"$O/$n.log" 2>&1 &  # a simple command: $! is the node itself, which cleanup stops
  PIDS+=($!)
  for _ in $(seq 300); do [ -s "$O/$n/endpoint" ] && return 0; sleep 0.1; done
  log "node $n did not start"; tail -20 "$O/$n.log"; exit 1
}
start_node a 1 --api-bind 127.0.0.1:8101
EA=$(cat "$O/a/endpoint")
start_node b 2 --api-bind off --peer "$EA"
start_node c 3 --api-bind off --peer "$EA"
URL=http://127.0.0.1:8101
api() { on_node a python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" "$URL$1"; }
for _ in $(seq 150); do
  healthy=$(api /api/mesh 2>/dev/null | python3 -c "import json,sys; print(sum(n['health']=='healthy' for n in json.load(sys.stdin)['nodes']))" 2>/dev/null)
  [ "${healthy:-0}" -ge 2 ] && break
  sleep 0.2
done
log "node a sees ${healthy:-0} healthy peers; $(grep -m1 -o 'meshnode [0-9a-f]* on port.*' "$O/a.log" || true)"

for s in $SPLITS; do
  id=split$s
  ln -sf "$MODEL" "$O/$id.gguf"
  if [ "$s" = 1 ]; then
    out=$(on_node a "$BIN/meshctl" --state-dir "$O/a" --secret-file "$O/secret" models load "$O/$id.gguf" --context "$CONTEXT" 2>&1)
  else
    out=$(on_node a "$BIN/meshctl" --state-dir "$O/a" --secret-file "$O/secret" models load "$O/$id.gguf" --context "$CONTEXT" --split "$s" 2>&1)
  fi
  rc=$?
  log "load $id: $(echo "$out" | tail -1)"
  [ $rc = 0 ] || continue
  on_node a "$BIN/meshctl" --state-dir "$O/a" --secret-file "$O/secret" models | grep "$id"
  on_node a python3 "$ROOT/bench/serving/load.py" --url "$URL" --model "$id" --streams "$STREAMS" --requests "$REQUESTS" \
    --max-tokens "$MAX_TOKENS" --prompt-words "$PROMPT_WORDS" --rounds "$ROUNDS" --label "split $s" --json "$O/results.jsonl"
  on_node a "$BIN/meshctl" --state-dir "$O/a" --secret-file "$O/secret" models unload "$id" >/dev/null 2>&1
done

# The added latency per hop: each remote stage costs a round trip per token (the serving node
# sends it the rows and waits for its answer), so (ITL p50 of split N - split 1) / (N - 1) is the
# cost of one remote stage per token at one stream.
python3 - "$O/results.jsonl" <<'EOF'
import json, sys
rows = {}
for l in open(sys.argv[1]):  # the last round of each split and level
    r = json.loads(l)
    rows[(r["label"], r["streams"])] = r
rows = list(rows.values())
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
