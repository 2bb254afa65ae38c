// Scenario: the official OpenAI Node SDK talks to a real model through Compactor.
//
// Even turns: `chat.completions.create(...).withResponse()` (non-streaming, headers from the
// response). Odd turns: the SDK's streaming helper `chat.completions.stream(...)` with its
// `content` events and `finalChatCompletion()`; its response headers are read through a `fetch`
// wrapper given to the client. The conversation is the same as the Python scenario's (printed by
// conversation.py) and goes on until the history is E2E_HISTORY_FACTOR times the window with at
// least E2E_MIN_COMPACTIONS checkpoints; the newest summary is fetched and printed.
//
// Environment: COMPACTOR_URL (required), E2E_MODEL, E2E_API_KEY (default sk-e2e-node),
// E2E_MAX_TOKENS, E2E_MIN_COMPACTIONS, E2E_HISTORY_FACTOR, E2E_MAX_TURNS, E2E_PYTHON.
// `openai` is resolved through NODE_PATH (the orchestrator's npm prefix).
'use strict';

const { execFileSync } = require('node:child_process');
const path = require('node:path');
const OpenAI = require('openai');

const BASE_URL = process.env.COMPACTOR_URL.replace(/\/+$/, '');
const MODEL = process.env.E2E_MODEL || 'qwen2.5-coder-0.5b-instruct';
const API_KEY = process.env.E2E_API_KEY || 'sk-e2e-node';
const MAX_TOKENS = Number(process.env.E2E_MAX_TOKENS || 40);
const MIN_COMPACTIONS = Number(process.env.E2E_MIN_COMPACTIONS || 3);
const HISTORY_FACTOR = Number(process.env.E2E_HISTORY_FACTOR || 3);
const MAX_TURNS = Number(process.env.E2E_MAX_TURNS || 20);

const log = (msg) => console.log(`[node] ${msg}`);

async function main() {
  const started = Date.now();
  const convo = JSON.parse(
    execFileSync(process.env.E2E_PYTHON || 'python3', [
      path.join(__dirname, 'conversation.py'),
      String(MAX_TURNS),
    ]).toString(),
  );

  let lastHeaders = null;
  const client = new OpenAI({
    baseURL: BASE_URL,
    apiKey: API_KEY,
    maxRetries: 0,
    timeout: 600_000,
    fetch: async (url, init) => {
      const response = await fetch(url, init);
      lastHeaders = response.headers;
      return response;
    },
  });

  const messages = [{ role: 'system', content: convo.system }];
  const checkpoints = [];
  let window = 0;
  let maxBefore = 0;
  let turn = 0;
  let done = false;
  for (; turn < MAX_TURNS; turn++) {
    messages.push({ role: 'user', content: convo.turns[turn] });
    const streaming = turn % 2 === 1;
    const t0 = Date.now();
    const params = { model: MODEL, messages, max_tokens: MAX_TOKENS, temperature: 0 };
    let text;
    let finish;
    let headers;
    try {
      if (streaming) {
        lastHeaders = null;
        const stream = client.chat.completions.stream(params);
        let deltas = 0;
        stream.on('content', () => {
          deltas += 1;
        });
        const completion = await stream.finalChatCompletion();
        text = completion.choices[0].message.content || '';
        finish = completion.choices[0].finish_reason;
        headers = lastHeaders;
        if (text && deltas === 0) throw new Error('streaming helper emitted no content events');
      } else {
        const { data, response } = await client.chat.completions.create(params).withResponse();
        text = data.choices[0].message.content || '';
        finish = data.choices[0].finish_reason;
        headers = response.headers;
      }
    } catch (e) {
      log(`turn ${turn + 1}: ${e.status || ''} ${e.message}`);
      return 1;
    }
    if (!finish) {
      log(`turn ${turn + 1}: the reply has no finish_reason`);
      return 1;
    }
    messages.push({ role: 'assistant', content: text });

    const compacted = headers && headers.get('x-compactor-compacted');
    if (compacted == null) {
      log(`turn ${turn + 1}: no x-compactor-* headers: is COMPACTOR_URL the proxy?`);
      return 1;
    }
    const before = Number(headers.get('x-compactor-tokens-before') || 0);
    const after = Number(headers.get('x-compactor-tokens-after') || 0);
    window = Number(headers.get('x-compactor-context-window') || 0) || window;
    const checkpoint = headers.get('x-compactor-checkpoint');
    const status = headers.get('x-compactor-compaction');
    maxBefore = Math.max(maxBefore, before);
    const isNew = checkpoint != null && !checkpoints.includes(checkpoint);
    if (isNew) checkpoints.push(checkpoint);
    log(
      `turn ${String(turn + 1).padStart(2)} ${streaming ? 'stream' : 'plain '} ` +
        `${((Date.now() - t0) / 1000).toFixed(1).padStart(5)}s compacted=${compacted} ` +
        `before=${before} after=${after} window=${window} checkpoint=${checkpoint || '-'}` +
        `${isNew ? ' NEW' : ''}${status ? ' status=' + status : ''} ` +
        `reply=${JSON.stringify(text.slice(0, 60))}`,
    );
    if (status && status.startsWith('failed')) {
      log(`turn ${turn + 1}: compaction failed: ${status}`);
      return 1;
    }
    if (window && maxBefore >= HISTORY_FACTOR * window && checkpoints.length >= MIN_COMPACTIONS) {
      done = true;
      break;
    }
  }
  if (!done) {
    log(
      `gave up after ${MAX_TURNS} turns: history ${maxBefore} tokens (window ${window}), ` +
        `${checkpoints.length} compactions`,
    );
    return 1;
  }

  const id = checkpoints[checkpoints.length - 1];
  const root = BASE_URL.replace(/\/v1$/, '');
  const res = await fetch(`${root}/compactor/v1/checkpoints/${id}`, {
    headers: { Authorization: `Bearer ${API_KEY}` },
  });
  if (!res.ok) {
    log(`GET checkpoint ${id}: HTTP ${res.status} ${await res.text()}`);
    return 1;
  }
  const cp = await res.json();
  const summary = cp.summary || '';
  if (summary.trim().length < 40) {
    log(`summary of checkpoint ${id} is too short: ${JSON.stringify(summary)}`);
    return 1;
  }
  if (cp.model !== MODEL) {
    log(`checkpoint ${id} names model ${JSON.stringify(cp.model)}, not ${JSON.stringify(MODEL)}`);
    return 1;
  }
  log(
    `summary of checkpoint ${id} (covers ${cp.covered} messages, ` +
      `${cp.tokens_before} -> ${cp.tokens_after} tokens):`,
  );
  for (const line of summary.split('\n')) console.log(`    ${line}`);
  const result = {
    scenario: 'openai-node',
    turns: turn + 1,
    compactions: checkpoints.length,
    history_tokens: maxBefore,
    window,
    seconds: Math.round((Date.now() - started) / 100) / 10,
  };
  console.log('E2E_RESULT ' + JSON.stringify(result));
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
