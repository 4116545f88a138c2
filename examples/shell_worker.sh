#!/usr/bin/env bash
# A herder worker in plain bash: proof that any program speaking
# docs/protocol.md can be a worker.
#
#   herder run --redis-url redis://127.0.0.1:6379/0 --worker-command "bash examples/shell_worker.sh"
#
# It takes "jobs" from a Redis list with redis-cli (BLPOP, 1 s at a time, so the idle
# heartbeat comes from the main loop), "runs" each by sleeping for the number it
# holds, and reports busy/done. It stops on `stop` or EOF on stdin.
# Try it:  redis-cli -u "$HERDER_REDIS_URL" rpush shell-jobs 1 2 3
set -eu

LIST=${SHELL_WORKER_LIST:-shell-jobs}
URL=${HERDER_REDIS_URL:?herder sets HERDER_REDIS_URL}

exec 3>&1 1>&2          # fd 3: private protocol channel; fd 1 now goes to the log
say() { printf '%s\n' "$*" >&3; }
now() { date +%s; }

stop_requested() {
    # Non-blocking look at stdin: `stop` or EOF ends the loop.
    if IFS= read -r -t 0 line 2>/dev/null; then
        IFS= read -r line || return 0   # EOF
        [ "$line" = stop ] && return 0
    fi
    return 1
}

say "ready $$ $(now) 1"
n=0
while ! stop_requested; do
    say "idle $(now)"
    item=$(redis-cli -u "$URL" --raw blpop "$LIST" 1 2>/dev/null | sed -n 2p) || item=""
    [ -n "$item" ] || continue
    n=$((n + 1))
    say "busy shell-$$-$n $(now) 60"
    if sleep "$item" 2>/dev/null; then
        say "done shell-$$-$n $(now) ok"
    else
        say "done shell-$$-$n $(now) failed"
    fi
done
say "stop $(now)"
