#!/usr/bin/env bash
# Process launcher for chat-7b release 20261130T000000Z-golden1 on hosts without systemd (host.launcher: process).
# Rendered by deployctl; do not edit. The same settings as the systemd unit:
#   launch.sh run     supervise in the foreground: pidfile, log file, restart on failure with backoff (never
#                     on exit 2, the runtime's configuration error, like RestartPreventExitStatus),
#                     SIGTERM forwarded to the runtime (drain), SIGKILL after 45 s
#   launch.sh start   the same, detached (setsid, stdin from /dev/null, output to the log file); prints the pid
#   launch.sh stop    SIGTERM the supervisor and wait up to 50 s; exit 1 if it is still there.
#                     Then what is left of the engine (found by its environment marker, below) gets SIGKILL, named
#                     on stderr and in the log. Without DEPLOYCTL_LAUNCH_PORT it stops everything of this deploy
#                     root: the serving supervisor, every other one (runtime.<port>.pid: the standby asleep on the
#                     other port, its shared/run/standby.json removed) and any engine process of the root left over;
#                     nothing runs after it
#   launch.sh status  exit 0 while the supervisor runs
#   launch.sh rotate-log  the log cap once (what run's keeper does every LOG_CHECK_S s; systemd: a timer)
# Pidfile (supervisor): /opt/deployctl/chat-7b/shared/run/runtime.pid · runtime pid: /opt/deployctl/chat-7b/shared/run/runtime.child.pid · log: /opt/deployctl/chat-7b/shared/logs/runtime.log
# `start` makes the supervisor a process group leader; the runtime and its children share that group, so a
# SIGKILL to the group (the rollout's last resort) leaves nothing behind. SIGTERM goes to the runtime's main
# process only (its workers keep serving while it drains), and the supervisor's SIGKILL after the stop timeout
# clears the group, as systemd's KillMode=mixed does. A worker can leave the group (setsid) and a killed supervisor
# leaves the engine behind, so the engine is also marked: it starts with DEPLOYCTL_INSTANCE=<deploy_root> and
# DEPLOYCTL_INSTANCE_PORT=<port> in its environment, which every process it starts inherits (hostscripts/snippets.py
# SH_ENGINE_PIDS reads /proc/PID/environ). After the runtime exits (a stop, a crash) its marked leftovers get SIGTERM,
# then SIGKILL; a new supervisor first ends the marked leftovers of a dead one on its port (kill -9 of the
# supervisor, then `start`), so a restart never finds the GPU memory held by orphans. The pidfile's number is the
# supervisor's pid, which is also its session and process group id (setsid). Env overrides (tests, diagnosis): DEPLOYCTL_LAUNCH_BACKOFF_S (first restart delay),
# DEPLOYCTL_LAUNCH_MAX_FAILURES, DEPLOYCTL_LAUNCH_STOP_TIMEOUT_S, DEPLOYCTL_LAUNCH_LOG_CHECK_S (how often the log's
# size is checked against deploy.yaml's logs.max_bytes; it is then copied to .1 and truncated, as logrotate's
# copytruncate does).
set -u
RELEASE_DIR=/opt/deployctl/chat-7b/releases/20261130T000000Z-golden1
PID_FILE=/opt/deployctl/chat-7b/shared/run/runtime.pid
CHILD_PID_FILE=/opt/deployctl/chat-7b/shared/run/runtime.child.pid
LOG_FILE=/opt/deployctl/chat-7b/shared/logs/runtime.log
INSTANCE_ROOT=/opt/deployctl/chat-7b
RUN_DIR="$(dirname "$PID_FILE")"
INSTANCE_PORT=8080  # the port this supervisor's runtime serves on: its engine's marker
ENGINE_CMD=(/opt/deployctl/venv/bin/python -m deployctl_runtime serve --config /opt/deployctl/chat-7b/releases/20261130T000000Z-golden1/runtime.yaml)
# DEPLOYCTL_LAUNCH_PORT=N: serve on port N instead of runtime.yaml's, as a second supervisor beside the serving one
# with pidfiles of its own (runtime.N.pid, runtime.child.N.pid): a rollback starts the restored release there,
# switches the router over, drains the old one, then links runtime.pid to these (deployctl.service.launcher)
if [ -n "${DEPLOYCTL_LAUNCH_PORT:-}" ]; then
  PID_FILE="${PID_FILE%.pid}.${DEPLOYCTL_LAUNCH_PORT}.pid"
  CHILD_PID_FILE="${CHILD_PID_FILE%.pid}.${DEPLOYCTL_LAUNCH_PORT}.pid"
  ENGINE_CMD+=(--port "$DEPLOYCTL_LAUNCH_PORT")
  INSTANCE_PORT=$DEPLOYCTL_LAUNCH_PORT
elif [ -L "$PID_FILE" ]; then  # runtime.pid -> runtime.<port>.pid: the service runs on that port (after a rollback)
  case "$(readlink "$PID_FILE")" in runtime.[0-9]*.pid) INSTANCE_PORT=$(readlink "$PID_FILE" | tr -dc 0-9) ;; esac
fi
BACKOFF_S=${DEPLOYCTL_LAUNCH_BACKOFF_S:-5}
MAX_BACKOFF_S=60
MAX_FAILURES=${DEPLOYCTL_LAUNCH_MAX_FAILURES:-5}
STABLE_AFTER_S=60
CONFIG_ERROR_EXIT=2  # the runtime's exit code for bad settings: never restarted
STOP_TIMEOUT_S=${DEPLOYCTL_LAUNCH_STOP_TIMEOUT_S:-45}
GPU_WAIT_S=120
LOG_MAX_BYTES=104857600
LOG_BACKUPS=5
LOG_CHECK_S=${DEPLOYCTL_LAUNCH_LOG_CHECK_S:-10}

log() { printf '%s launch.sh[%s]: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$$" "$*" >>"$LOG_FILE"; }

alive() { kill -0 "$1" 2>/dev/null && ! grep -qs '^State:[[:space:]]*Z' "/proc/$1/status"; }
ours() { alive "$1" || return 1; local r; for r in "$2" "$(readlink -f "$2" 2>/dev/null)"; do
  [ -n "$r" ] || continue
  tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$r/releases/" && return 0
  case "$(readlink "/proc/$1/cwd" 2>/dev/null)" in "$r"/releases/*) return 0;; esac
done; return 1; }
group_ours() { local p; ours "$1" "$2" && return 0
  for p in $(pgrep -g "$1" 2>/dev/null); do ours "$p" "$2" && return 0; done; return 1; }
engine_pids() { local f p files
  files=$(grep -lzsxF -e "DEPLOYCTL_INSTANCE=$1" /proc/[0-9]*/environ 2>/dev/null); [ -n "$files" ] || return 0
  if [ -n "${2:-}" ]; then
    files=$(grep -lzsxF -e "DEPLOYCTL_INSTANCE_PORT=$2" $files 2>/dev/null); [ -n "$files" ] || return 0
  fi
  for f in $files; do p=${f#/proc/}; p=${p%/environ}; [ "$p" != "$$" ] && alive "$p" && echo "$p"; done; return 0; }
describe_pids() { local p c s=""; for p; do c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
  printf '%s%s (%s)' "$s" "$p" "$c"; s=", "; done; }

# the pidfile's supervisor (default $PID_FILE), if it is alive and one of this deploy root's (a stale pidfile's
# number reused by another process is not a running supervisor: `start` would otherwise start nothing and `stop`
# signal a stranger)
supervisor_pid() {
  local pid
  pid=$(cat "${1:-$PID_FILE}" 2>/dev/null) || return 1
  [ -n "$pid" ] && ours "$pid" "${RELEASE_DIR%/releases/*}" && echo "$pid"
}

# another live supervisor of this deploy root serving PORT (not this one, not $2): its pid. runtime.pid serves
# 8080 (or, as a link, its target's port), runtime.<port>.pid that port.
port_supervisor() {
  local f p n
  for f in "$RUN_DIR"/runtime.pid "$RUN_DIR"/runtime.[0-9]*.pid; do
    [ -e "$f" ] || continue
    n=$(basename "$(readlink "$f" 2>/dev/null || echo "$f")"); n=${n#runtime.}; n=${n%pid}; n=${n%.}
    [ -n "$n" ] || n=8080
    [ "$n" = "$1" ] || continue
    p=$(supervisor_pid "$f") || continue
    [ "$p" != "$$" ] && [ "$p" != "${2:-}" ] && { echo "$p"; return 0; }
  done
  return 1
}

# end_leftovers PORT GRACE_S: the marked engine processes of PORT ("": of any port of this deploy root) get
# SIGTERM, up to GRACE_S s (whole seconds) to exit, then SIGKILL; what needed the SIGKILL is named in the log and
# on stderr. Not while another live supervisor serves PORT (they are its engine, not leftovers). Returns 1 when
# something is still alive 5 s after the SIGKILL (a process stuck in the kernel).
end_leftovers() {
  local pids i msg other
  if [ -n "$1" ] && other=$(port_supervisor "$1" "${3:-}"); then
    log "port $1 is served by supervisor pid $other: its engine is left alone"; return 0
  fi
  pids=$(engine_pids "$INSTANCE_ROOT" "$1"); [ -n "$pids" ] || return 0
  kill -TERM $pids 2>/dev/null
  for ((i = 0; i < ${2%.*} * 10; i++)); do
    pids=$(engine_pids "$INSTANCE_ROOT" "$1"); [ -n "$pids" ] || return 0; sleep 0.1
  done
  pids=$(engine_pids "$INSTANCE_ROOT" "$1"); [ -n "$pids" ] || return 0
  msg="killed leftovers of the engine${1:+ on port $1} after ${2%.*}s: $(describe_pids $pids)"
  kill -KILL $pids 2>/dev/null
  log "$msg"; echo "launch.sh: $msg" >&2
  for ((i = 0; i < 50; i++)); do [ -z "$(engine_pids "$INSTANCE_ROOT" "$1")" ] && return 0; sleep 0.1; done
  pids=$(engine_pids "$INSTANCE_ROOT" "$1")
  log "still alive after SIGKILL: $(describe_pids $pids)"; echo "launch.sh: still alive after SIGKILL: $(describe_pids $pids)" >&2
  return 1
}

# stop_supervisor PIDFILE PORT: SIGTERM the supervisor (its runtime drains), wait up to STOP_TIMEOUT_S + 5 s, then
# end what is left of the engine on PORT (a supervisor already gone: its orphans drain up to STOP_TIMEOUT_S first).
# Returns 1 when the supervisor or a leftover is still alive.
stop_supervisor() {
  local pid i
  if pid=$(supervisor_pid "$1"); then
    kill -TERM "$pid"
    for ((i = 0; i < (STOP_TIMEOUT_S + 5) * 10; i++)); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then echo "launch.sh: pid $pid still running after $((STOP_TIMEOUT_S + 5))s" >&2; return 1; fi
    end_leftovers "$2" 1 "$pid"
  else
    end_leftovers "$2" "$STOP_TIMEOUT_S"
  fi
}

# The log past LOG_MAX_BYTES: older copies shift (.1 -> .2, ...; LOG_BACKUPS kept), then copy and truncate in place:
# the runtime keeps its O_APPEND descriptor and writes on at the new end (nothing restarts).
rotate_log() {
  local size i
  size=$(stat -c %s "$LOG_FILE" 2>/dev/null) || return 0
  [ "$size" -ge "$LOG_MAX_BYTES" ] || return 0
  for ((i = LOG_BACKUPS - 1; i >= 1; i--)); do
    [ -f "$LOG_FILE.$i" ] && mv -f "$LOG_FILE.$i" "$LOG_FILE.$((i + 1))"
  done
  cp -f "$LOG_FILE" "$LOG_FILE.1" && : >"$LOG_FILE"
  log "log reached $size bytes (logs.max_bytes $LOG_MAX_BYTES): rotated to $LOG_FILE.1"
}

run() {
  mkdir -p "$(dirname "$PID_FILE")" "$(dirname "$LOG_FILE")"
  if pid=$(supervisor_pid); then echo "already running as pid $pid" >&2; exit 1; fi
  echo $$ >"$PID_FILE"
  # a supervisor killed before its cleanup (kill -9, OOM killer) left its engine running: end it first (it holds the
  # port and, on a GPU, the memory this start needs)
  end_leftovers "$INSTANCE_PORT" "$STOP_TIMEOUT_S"
  cd "$RELEASE_DIR" || exit 1
  set -a; . "$RELEASE_DIR/runtime.env"; set +a
  export PYTHONUNBUFFERED=1
  export CUDA_DEVICE_ORDER=PCI_BUS_ID
  export CUDA_VISIBLE_DEVICES=0
  # Bounded wait for the GPUs (driver loaded, devices visible) before the first start.
  deadline=$(( $(date +%s) + GPU_WAIT_S ))
  until nvidia-smi -i 0 -L >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then log "GPU 0 not ready after ${GPU_WAIT_S}s; giving up"; rm -f "$PID_FILE"; exit 1; fi
    sleep 2
  done
  stopping=0; child=0
  on_term() {
    stopping=1; stop_at=$(date +%s)
    if [ "$child" -gt 0 ]; then
      log "SIGTERM: draining runtime pid $child (up to ${STOP_TIMEOUT_S}s)"
      kill -TERM "$child" 2>/dev/null
      ( trap 'kill "$s" 2>/dev/null; exit 0' TERM; sleep "$STOP_TIMEOUT_S" & s=$!; wait "$s"
        trap '' TERM  # from here on, finish even though the supervisor is told the runtime is gone
        log "runtime pid $child still running after ${STOP_TIMEOUT_S}s: SIGKILL"; kill -KILL "$child" 2>/dev/null
        if [ "$(ps -o pgid= -p $$ | tr -d ' ')" = "$$" ]; then  # the runtime's leftovers in our group
          for p in $(pgrep -g "$$"); do [ "$p" = "$$" ] || [ "$p" = "$BASHPID" ] || kill -KILL "$p" 2>/dev/null; done
        fi
        left=$(engine_pids "$INSTANCE_ROOT" "$INSTANCE_PORT")  # and those that left the group (setsid)
        [ -z "$left" ] || { log "SIGKILL to the engine's leftovers: $(describe_pids $left)"; kill -KILL $left 2>/dev/null; } ) &
      killer=$!
    fi
  }
  trap on_term TERM INT
  # the log keeper: as long as this supervisor lives (a supervisor killed alone leaves no keeper behind)
  supervisor=$$
  ( trap 'kill "$s" 2>/dev/null; exit 0' TERM; trap - INT
    while alive "$supervisor"; do rotate_log; sleep "$LOG_CHECK_S" & s=$!; wait "$s"; done ) </dev/null &
  keeper=$!
  trap 'kill "$keeper" 2>/dev/null' EXIT
  failures=0; delay=$BACKOFF_S
  while :; do
    started=$(date +%s)
    sha256sum /models/llm-7b-chat/manifest.sha256 >/opt/deployctl/chat-7b/shared/run/runtime.model.sha256 2>/dev/null || rm -f /opt/deployctl/chat-7b/shared/run/runtime.model.sha256
    log "starting runtime: ${ENGINE_CMD[*]}"
    DEPLOYCTL_INSTANCE="$INSTANCE_ROOT" DEPLOYCTL_INSTANCE_PORT="$INSTANCE_PORT" "${ENGINE_CMD[@]}" </dev/null >>"$LOG_FILE" 2>&1 &
    child=$!
    echo "$child" >"$CHILD_PID_FILE"
    # `wait` returns early when a trapped signal arrives: keep waiting until the child is gone.
    while :; do
      wait "$child"; rc=$?
      kill -0 "$child" 2>/dev/null || break
    done
    child=0
    rm -f "$CHILD_PID_FILE"
    if [ "$stopping" = 1 ]; then
      [ -n "${killer:-}" ] && { kill "$killer" 2>/dev/null; wait "$killer" 2>/dev/null; }
      # the runtime is gone: its workers get what is left of the drain bound, then SIGKILL
      left_s=$(( STOP_TIMEOUT_S - ($(date +%s) - stop_at) )); [ "$left_s" -ge 1 ] || left_s=1
      end_leftovers "$INSTANCE_PORT" "$left_s"
      log "runtime stopped (exit $rc)"; break
    fi
    # a runtime that exited (crash, kill -9) may leave workers holding the port and the GPU memory
    end_leftovers "$INSTANCE_PORT" $(( STOP_TIMEOUT_S < 5 ? STOP_TIMEOUT_S : 5 ))
    if [ "$rc" = 0 ]; then log "runtime exited cleanly"; break; fi
    if [ "$rc" = "$CONFIG_ERROR_EXIT" ]; then
      log "runtime exited with $rc (configuration error); not restarting, giving up"; rm -f "$PID_FILE"; exit "$rc"
    fi
    if [ $(( $(date +%s) - started )) -ge "$STABLE_AFTER_S" ]; then failures=0; delay=$BACKOFF_S; fi
    failures=$((failures + 1))
    if [ "$failures" -ge "$MAX_FAILURES" ]; then
      log "runtime failed $failures times in a row (last exit $rc); giving up"; rm -f "$PID_FILE"; exit 1
    fi
    log "runtime exited with $rc; restart $failures/$((MAX_FAILURES - 1)) in ${delay}s"
    sleep "$delay" & sleeper=$!; wait "$sleeper"; kill "$sleeper" 2>/dev/null
    [ "$stopping" = 1 ] && break
    delay=$(awk -v d="$delay" -v m="$MAX_BACKOFF_S" 'BEGIN { d *= 2; if (d > m) d = m; print d }')
  done
  rm -f "$PID_FILE"
  exit 0
}

case "${1:-run}" in
  run) run ;;
  start)
    if pid=$(supervisor_pid); then echo "$pid"; exit 0; fi
    mkdir -p "$(dirname "$LOG_FILE")"
    setsid "$0" run </dev/null >>"$LOG_FILE" 2>&1 &
    for _ in $(seq 50); do pid=$(supervisor_pid) && { echo "$pid"; exit 0; }; sleep 0.1; done
    echo "launch.sh: supervisor did not start; see $LOG_FILE" >&2; exit 1 ;;
  stop)
    rc=0
    stop_supervisor "$PID_FILE" "$INSTANCE_PORT" || rc=1
    if [ -z "${DEPLOYCTL_LAUNCH_PORT:-}" ]; then
      # every other supervisor of this deploy root: the standby (the previous release asleep on the other port,
      # deployctl.rollout.standby) and any started beside the service (runtime.<port>.pid)
      for f in "$RUN_DIR"/runtime.[0-9]*.pid; do
        [ -e "$f" ] || continue
        n=${f##*/runtime.}; n=${n%.pid}
        stop_supervisor "$f" "$n" || rc=1
      done
      standby=$(sed -n 's/.*"port": *\([0-9][0-9]*\).*/\1/p' "$RUN_DIR/standby.json" 2>/dev/null)
      if [ -n "$standby" ]; then rm -f "$RUN_DIR/standby.json"; log "stopped the standby on port $standby"; fi
      end_leftovers "" 1 || rc=1  # anything of this deploy root's engines, whatever its port
    fi
    exit $rc ;;
  status) supervisor_pid >/dev/null ;;
  rotate-log) rotate_log ;;  # the systemd launcher's chat-7b-logs.timer runs this
  *) echo "usage: launch.sh run|start|stop|status|rotate-log" >&2; exit 2 ;;
esac
