#!/usr/bin/env bash
# Run the official MCP server conformance scenarios (@modelcontextprotocol/conformance)
# against a Streamable HTTP endpoint, one scenario per harness invocation (so one hung
# scenario cannot sink the run), and finish with the line:
#     conformance: N passed, M failed
# N / M count individual checks (SUCCESS / FAILURE), as the harness's own "Total:" line does.
#
# usage:
#   conformance.sh URL [--suite active|all|pending] [--scenario NAME]... [--expected-failures FILE]
#                      [--spec-version V]
#   conformance.sh --list [--spec-version V]  # print the server scenarios of the pinned harness
#   conformance.sh --install               # only install (or check) the harness and node 22; prints node path
# The upstreams the scenarios expect are tests/fixtures/conformance_server.py (0.1.16) and
# tests/fixtures/conformance_modern_server.py (2026-07-28); tests/conformance/ runs them
# directly and through bastion (see docs/conformance.md).
# env:
#   PEERS_DIR            install/cache dir, kept between runs (default $HOME/.cache/bastion-peers)
#   CONFORMANCE_VERSION  harness version (default 0.1.16; 0.2.0-alpha.12 has the 2026-07-28 scenarios, which
#                        run on the 2026-07-28 wire with --spec-version 2026-07-28)
#   SCENARIO_TIMEOUT     seconds per scenario before it counts as 1 failed check (default 60)
#   CONFORMANCE_OUT      if set, per-scenario checks.json files are written under it
#   CONFORMANCE_NODE     a node >= 22 to use (default: PATH node if >= 22, else one from npm)
# exit: 0 if no check failed (with --expected-failures: if every scenario matched the baseline),
#       1 otherwise, 2 on usage / install errors.
# Only talks to URL (and the npm registry while installing). Needs node + npm on PATH.
set -u -o pipefail

PEERS_DIR="${PEERS_DIR:-${HOME:-/tmp}/.cache/bastion-peers}"
CONFORMANCE_VERSION="${CONFORMANCE_VERSION:-0.1.16}"
SCENARIO_TIMEOUT="${SCENARIO_TIMEOUT:-60}"
# Each version's "pending" scenarios (excluded from the "active" suite). The harness does not print
# this split, so it is pinned here per version; add a line when pinning a new CONFORMANCE_VERSION.
# 0.2.0-alpha.12: the harness's own pending list minus the extension scenarios (tasks-*, sep-2640-*),
# which --spec-version never selects; its "draft" suite (scenarios introduced in 2026-07-28) is not
# treated as pending here: with --spec-version 2026-07-28 those are the point of the run.
case "$CONFORMANCE_VERSION" in
  0.1.16) PENDING="json-schema-2020-12 server-sse-polling" ;;
  0.2.0-alpha.12) PENDING="json-schema-2020-12 server-sse-polling http-header-validation http-custom-header-server-validation" ;;
  *) PENDING="" ; UNPINNED=1 ;;
esac

log() { echo "[conformance.sh] $*" >&2; }
die() { log "$*"; echo "conformance: 0 passed, 1 failed"; exit 2; }

node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

npm_quiet_install() {  # dir, package spec
  mkdir -p "$1" || return 1
  [ -f "$1/package.json" ] || (cd "$1" && npm init -y >/dev/null 2>&1) || return 1
  (cd "$1" && npm install --no-audit --no-fund --loglevel=error "$2" >/dev/null 2>&1)
}

find_node22() {
  if [ -n "${CONFORMANCE_NODE:-}" ]; then echo "$CONFORMANCE_NODE"; return 0; fi
  if command -v node >/dev/null && [ "$(node_major node)" -ge 22 ]; then command -v node; return 0; fi
  local arch; case "$(uname -m)" in x86_64) arch=x64 ;; aarch64|arm64) arch=arm64 ;; *) arch=x64 ;; esac
  local n="$PEERS_DIR/node22/node_modules/node-linux-$arch/bin/node"
  if [ ! -x "$n" ] || [ "$(node_major "$n")" -lt 22 ]; then
    log "node >= 22 needed by the harness (fs.globSync); installing node-linux-$arch@22 from npm into $PEERS_DIR/node22"
    npm_quiet_install "$PEERS_DIR/node22" "node-linux-$arch@22" || return 1
  fi
  [ -x "$n" ] && echo "$n"
}

ensure_harness() {
  HDIR="$PEERS_DIR/conformance-$CONFORMANCE_VERSION"
  HARNESS="$HDIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"
  if [ ! -f "$HARNESS" ] || ! grep -q "\"version\": \"$CONFORMANCE_VERSION\"" \
      "$HDIR/node_modules/@modelcontextprotocol/conformance/package.json" 2>/dev/null; then
    log "installing @modelcontextprotocol/conformance@$CONFORMANCE_VERSION into $HDIR"
    npm_quiet_install "$HDIR" "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" \
      || die "npm install of the harness failed"
  fi
  NODE22="$(find_node22)" || die "could not get a node >= 22"
}

# ---- arguments
[ $# -ge 1 ] || { sed -n '2,29p' "$0"; exit 2; }
case "$1" in
  --install) ensure_harness; echo "$NODE22"; exit 0 ;;
  --list) ensure_harness; shift; exec "$NODE22" "$HARNESS" list --server "$@" ;;
  -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
esac
URL="$1"; shift
SUITE=active; SCENARIOS=(); EXTRA=(); LIST_EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) SUITE="$2"; shift 2 ;;
    # The harness runs each scenario on this revision's wire (2026-07-28: stateless, _meta on every request)
    # and skips scenarios that do not apply to it.
    --spec-version) EXTRA+=(--spec-version "$2"); LIST_EXTRA+=(--spec-version "$2"); shift 2 ;;
    --scenario) SCENARIOS+=("$2"); shift 2 ;;
    --expected-failures) EXTRA+=(--expected-failures "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift 2 ;;
    *) die "unknown argument: $1" ;;
  esac
done

ensure_harness
if [ ${#SCENARIOS[@]} -eq 0 ]; then
  [ "$SUITE" = all ] || [ -z "${UNPINNED:-}" ] || die "no pending list pinned for harness $CONFORMANCE_VERSION; use --suite all or --scenario"
  mapfile -t ALL < <("$NODE22" "$HARNESS" list --server "${LIST_EXTRA[@]}" | sed -n 's/^  - \([^ ]*\).*/\1/p')
  [ ${#ALL[@]} -gt 0 ] || die "harness listed no server scenarios"
  for s in "${ALL[@]}"; do
    pending=0; for p in $PENDING; do [ "$s" = "$p" ] && pending=1; done
    case "$SUITE" in
      all) SCENARIOS+=("$s") ;;
      active) [ $pending = 0 ] && SCENARIOS+=("$s") ;;
      pending) [ $pending = 1 ] && SCENARIOS+=("$s") ;;
      *) die "unknown suite $SUITE (active|all|pending)" ;;
    esac
  done
fi
[ -n "${CONFORMANCE_OUT:-}" ] && { mkdir -p "$CONFORMANCE_OUT"; EXTRA+=(-o "$CONFORMANCE_OUT"); }

log "harness $CONFORMANCE_VERSION, node $("$NODE22" --version), ${#SCENARIOS[@]} scenarios against $URL"
TP=0; TF=0; TW=0; RC=0
for s in "${SCENARIOS[@]}"; do
  out="$(cd "$HDIR" && timeout -k 5 "$SCENARIO_TIMEOUT" "$NODE22" "$HARNESS" server --url "$URL" \
         --scenario "$s" "${EXTRA[@]}" 2>&1)"; rc=$?
  # "Passed: P/D, F failed, W warnings"
  line="$(printf '%s\n' "$out" | sed 's/\x1b\[[0-9;]*m//g' | grep -E '^Passed: [0-9]+/[0-9]+, [0-9]+ failed' | tail -1)"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    p=0; f=1; w=0; note="TIMEOUT after ${SCENARIO_TIMEOUT}s"
  elif [ -n "$line" ]; then
    p="$(sed -E 's/^Passed: ([0-9]+)\/.*/\1/' <<<"$line")"
    f="$(sed -E 's/^Passed: [0-9]+\/[0-9]+, ([0-9]+) failed.*/\1/' <<<"$line")"
    w="$(sed -nE 's/.* ([0-9]+) warnings.*/\1/p' <<<"$line")"; w="${w:-0}"
    note=""
    [ "$f" -gt 0 ] && note="$(printf '%s\n' "$out" | sed 's/\x1b\[[0-9;]*m//g' \
                              | grep -E '^    Error: ' | head -2 | sed 's/^ *//' | tr '\n' ' ')"
  else
    p=0; f=1; w=0; note="harness rc=$rc, no result line: $(printf '%s' "$out" | tail -c 300 | tr '\n' ' ')"
  fi
  [ $rc -ne 0 ] && RC=1
  TP=$((TP + p)); TF=$((TF + f)); TW=$((TW + w))
  printf '%s %-32s %3s passed, %s failed, %s warnings %s\n' \
    "$([ "$f" -eq 0 ] && echo PASS || echo FAIL)" "$s" "$p" "$f" "$w" "${note:+ -- $note}"
done
log "warnings (SHOULD-level, not counted as failures): $TW"
echo "conformance: $TP passed, $TF failed"
exit $RC
