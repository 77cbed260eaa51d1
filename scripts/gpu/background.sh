#!/usr/bin/env bash
# A long job across device calls on a warm machine: started in its own session, so it
# outlives the call that started it (until the machine goes back), and followed by later
# calls, which keep the machine warm while they wait.
#   bash scripts/gpu/background.sh start NAME CMD...  # starts CMD unless NAME ran already
#   bash scripts/gpu/background.sh wait NAME SECONDS  # until NAME ends or SECONDS pass
#   bash scripts/gpu/background.sh pack DIR OUT       # DIR as OUT/NAME.tgz, in parts < 15 MiB
# State in /tmp/bg/NAME: pid, log (CMD's output), rc (once CMD has ended).
set -uo pipefail
verb=${1:?usage: background.sh start NAME CMD... | wait NAME SECONDS | pack DIR OUT}
case $verb in
  start)
    name=${2:?NAME}; shift 2
    state=/tmp/bg/$name
    if [ -f "$state/pid" ]; then echo "$name: started before (pid $(cat "$state/pid"))"; exit 0; fi
    mkdir -p "$state"
    setsid bash -c 'echo $$ >"$1/pid"; shift; "$@"; echo $? >"$0/rc"' "$state" "$state" "$@" \
      >"$state/log" 2>&1 </dev/null &
    for _ in $(seq 50); do [ -f "$state/pid" ] && break; sleep 0.1; done
    echo "$name: started (pid $(cat "$state/pid" 2>/dev/null || echo '?'), log $state/log)" ;;
  wait)
    name=${2:?NAME} seconds=${3:?SECONDS}
    state=/tmp/bg/$name
    [ -f "$state/pid" ] || { echo "$name: never started on this machine"; exit 1; }
    end=$((SECONDS + seconds))
    while [ ! -f "$state/rc" ] && ((SECONDS < end)); do sleep 5; done
    tail -n 40 "$state/log"
    if [ -f "$state/rc" ]; then echo "$name: ended, rc $(cat "$state/rc")"
    else echo "$name: still running after ${seconds} s"; fi ;;
  pack)
    dir=${2:?DIR} out=${3:?OUT}
    [ -d "$dir" ] || { echo "pack: no folder $dir"; exit 1; }
    base=$(basename "$dir")
    tar czf - -C "$(dirname "$dir")" "$base" | split -b 15M -d - "$out/$base.tgz.part"
    ls -l "$out" ;;
  *) echo "unknown verb $verb: start, wait or pack"; exit 2 ;;
esac
