# The steps of the one-pass check scripts (cuda_check.sh, cpu_check.sh), sourced by them: each runs a
# command under a time cap with its output in $out, and says how it ended.

step() {  # step NAME SECONDS COMMAND...: run under a cap, log to $out/NAME.log, say how it ended
    local name=$1 cap=$2; shift 2
    local t0=$SECONDS
    timeout -k 5 "$cap" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc in $((SECONDS - t0)) s"
    tail -n "${TAIL:-6}" "$out/$name.log"
}

jstep() {  # jstep NAME SECONDS COMMAND...: as step, the command's stdout (its JSON) to $out/NAME.json
    local name=$1 cap=$2; shift 2
    local t0=$SECONDS
    timeout -k 5 "$cap" "$@" >"$out/$name.json" 2>"$out/$name.log"
    local rc=$?
    echo "== $name: rc $rc in $((SECONDS - t0)) s"
    tail -n "${TAIL:-6}" "$out/$name.log"
}
