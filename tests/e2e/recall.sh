# Sourced by the agent scenarios: the recall turn's bookkeeping (see recall.py).
#
#   recall_begin            before the recall turn: where Compactor's log and the relay's log end
#   recall_end NAME ANSWER  after it: the facts must be in what Compactor forwarded for it, with
#                           at least two compactions before it (E2E_RECALL_MIN_COMPACTIONS)
# Needs $py, $here, $mark (Compactor's log offset at the scenario's start), E2E_COMPACTOR_LOG and
# E2E_RELAY_LOG.

recall_begin() {
  recall_log_mark="$("$py" "$here/compactor_probe.py" mark "$E2E_COMPACTOR_LOG")"
  recall_relay_mark="$(wc -l <"${E2E_RELAY_LOG:?the recall check reads the relay log}")"
}

recall_end() {
  "$py" "$here/recall.py" check --scenario "$1" --answer "$2" \
    --relay "$E2E_RELAY_LOG" --relay-since "$recall_relay_mark" \
    --log "$E2E_COMPACTOR_LOG" --since "$mark" --until "$recall_log_mark" \
    --min-compactions "${E2E_RECALL_MIN_COMPACTIONS:-2}"
}
