#!/usr/bin/env bash
# Prints a Codex config.toml with a minimized prompt (about 750 tokens instead of 6,000: a short
# instructions file, no web search, skills, apps, multi-agent or environment context) and writes
# the instructions file into the Codex home.
#
#   codex_config.sh CODEX_HOME compactor=BASE_URL   a custom provider "compactor", wire_api
#                                                   "responses", key from $COMPACTOR_KEY
#   codex_config.sh CODEX_HOME openai=BASE_URL      the built-in OpenAI provider at BASE_URL, with
#                                                   its own compaction at 1,000 tokens
#
# E2E_MODEL names the model. model_context_window is far above any real window here, so that
# Codex never compacts on its own: Compactor does.
set -euo pipefail
home="$1"
provider="${2%%=*}"
base_url="${2#*=}"
model="${E2E_MODEL:-qwen2.5-coder-0.5b-instruct}"

mkdir -p "$home"
echo "You are a coding agent. Answer briefly, in one or two sentences." >"$home/instructions.md"

echo "model = \"$model\""
case "$provider" in
  compactor) echo 'model_provider = "compactor"' ;;
  openai)
    echo "openai_base_url = \"$base_url\""
    echo "model_auto_compact_token_limit = 1000"
    ;;
  *) echo "codex_config.sh: unknown provider $provider" >&2; exit 2 ;;
esac
cat <<EOF
model_context_window = 65536
model_instructions_file = "$home/instructions.md"
web_search = "disabled"
include_environment_context = false
include_permissions_instructions = false
include_apps_instructions = false
include_collaboration_mode_instructions = false
EOF
if [[ "$provider" == compactor ]]; then
  cat <<EOF

[model_providers.compactor]
name = "compactor"
base_url = "$base_url"
wire_api = "responses"
env_key = "COMPACTOR_KEY"
EOF
fi
cat <<'EOF'

[skills]
include_instructions = false

[tools.experimental_request_user_input]
enabled = false

# No sub-agent tools (`[features] multi_agent`, which did this before, is deprecated).
[agents]
enabled = false

[features]
view_image = false
goals = false
apps = false
plugins = false
skill_search = false
image_generation = false
tool_suggest = false
sleep_tool = false
EOF
