# What Slurm's hooks of vram-exporter share (sourced by epilog, prolog and healthcheck,
# which sit beside it): the settings, the log, one look with `vram-exporter check`, and
# the node's drain state. POSIX sh: Slurm runs the hooks with dash on Debian, bash on
# RHEL, and with next to no environment (a HealthCheckProgram gets no PATH).
#
# Settings, each a shell variable, read from $VRAM_EXPORTER_SLURM_SETTINGS, else from
# /etc/default/vram-exporter-slurm (the .deb) or /etc/sysconfig/vram-exporter-slurm (the
# .rpm); docs/slurm.md describes each.

PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
export PATH

if [ -z "${VRAM_EXPORTER_SLURM_SETTINGS:-}" ]; then
    for settings in /etc/default/vram-exporter-slurm /etc/sysconfig/vram-exporter-slurm; do
        if [ -r "$settings" ]; then
            VRAM_EXPORTER_SLURM_SETTINGS=$settings
            break
        fi
    done
fi
if [ -n "${VRAM_EXPORTER_SLURM_SETTINGS:-}" ]; then
    # shellcheck disable=SC1090
    . "$VRAM_EXPORTER_SLURM_SETTINGS"
fi

: "${VRAM_EXPORTER:=/usr/bin/vram-exporter}"
: "${VRAM_EXPORTER_CHECK_ARGS:=}"
: "${VRAM_EXPORTER_GPU_NUMBERING:=minor}"
: "${VRAM_EXPORTER_FOREIGN:=yes}"
: "${VRAM_EXPORTER_LOG:=syslog}"
: "${VRAM_EXPORTER_EPILOG_WAIT:=30s}"
: "${VRAM_EXPORTER_EPILOG_TIMEOUT:=10s}"
: "${VRAM_EXPORTER_PROLOG_WAIT:=2s}"
: "${VRAM_EXPORTER_PROLOG_TIMEOUT:=3s}"
: "${VRAM_EXPORTER_HEALTHCHECK_WAIT:=5s}"
: "${VRAM_EXPORTER_HEALTHCHECK_TIMEOUT:=10s}"
: "${SCONTROL:=scontrol}"

# Every drain reason these hooks set starts with this: the health check resumes only the
# nodes whose reason does, as NHC resumes only those whose reason starts with "NHC:".
REASON_PREFIX="vram: "

NODE=${SLURMD_NODENAME:-$(hostname -s)}

# Say something in the log: `say LEVEL MESSAGE...`, LEVEL a syslog level (info,
# warning, err). Each line of MESSAGE is a line of the log.
say() {
    level=$1
    shift
    printf '%s\n' "$*" | while IFS= read -r line; do
        if [ "$VRAM_EXPORTER_LOG" = syslog ]; then
            logger -t "vram-exporter-$HOOK" -p "daemon.$level" -- "$WHAT: $line" 2>/dev/null ||
                printf '%s\n' "vram-exporter-$HOOK: $WHAT: $line" >&2
        else
            printf '%s %s vram-exporter-%s: %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
                "$level" "$HOOK" "$WHAT" "$line" >>"$VRAM_EXPORTER_LOG"
        fi
    done
}

# One look: `look ARGS...` runs `vram-exporter check --summary --exit-codes plugin` (and
# --foreign, unless the settings say no) with the settings' flags and ARGS. Sets SUMMARY (the verdict's line), STATUS (0 clear, 1
# memory left over, anything else cannot tell) and REPORT (the tables and verdicts, and
# what went wrong), which the hook logs when it matters.
look() {
    report=$(mktemp) || {
        SUMMARY="cannot make a temporary file"
        STATUS=3
        REPORT=""
        return
    }
    foreign=--foreign
    [ "$VRAM_EXPORTER_FOREIGN" = yes ] || foreign=""
    # shellcheck disable=SC2086
    SUMMARY=$("$VRAM_EXPORTER" check --summary --exit-codes plugin $foreign "$@" \
        $VRAM_EXPORTER_CHECK_ARGS 2>"$report")
    STATUS=$?
    REPORT=$(cat "$report")
    rm -f "$report"
    [ -n "$SUMMARY" ] || SUMMARY="vram-exporter check said nothing (exit status $STATUS)"
}

# The node's state (IDLE+DRAIN, MIXED, ...) and drain reason, from scontrol: sets STATE
# and REASON (empty when none, without the [user@time] Slurm adds).
node_state() {
    shown=$("$SCONTROL" show node "$NODE" 2>&1) || {
        say err "cannot read the state of node $NODE: $shown"
        return 1
    }
    STATE=$(printf '%s\n' "$shown" | sed -n 's/^ *State=\([^ ]*\).*/\1/p')
    REASON=$(printf '%s\n' "$shown" | sed -n 's/^ *Reason=\(.*\) \[[^]]*\]$/\1/p')
}

# Drain the node with REASON_PREFIX and the verdict's line.
drain() {
    if said=$("$SCONTROL" update NodeName="$NODE" State=DRAIN Reason="$REASON_PREFIX$1" 2>&1); then
        say err "drained node $NODE: $REASON_PREFIX$1"
    else
        say err "cannot drain node $NODE ($said); Slurm's own reason stands"
        return 1
    fi
}
