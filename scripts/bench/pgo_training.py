#!/usr/bin/env python3
"""The training run of a profile-guided build (scripts/build-pgo): the requests whose code paths
the profile should favour, sent to a running proxy (instrumented) in front of slow_mock.py.

What a proxy in front of agents serves most, in rough proportion: small kept-alive chat
requests, JSON and streamed; Messages and Responses requests; conversations that grow past a
small window, so that checkpoints are made, stored and applied; and a few large bodies.
Standard library only.

Usage: pgo_training.py --url http://127.0.0.1:PORT [--scale 1.0]
"""
import argparse
import http.client
import json
import urllib.parse

WORDS = ("the proxy keeps the conversation going while the window fills up with tool results "
         "and file contents that the agent read earlier in the session").split()


def text(n_words, seed):
    return " ".join(WORDS[(seed + i * 7) % len(WORDS)] for i in range(n_words))


class Client:
    """One kept-alive connection, as SDKs hold them."""

    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)

    def post(self, path, body, headers=None):
        h = {"content-type": "application/json", "authorization": "Bearer sk-training"}
        h.update(headers or {})
        self.conn.request("POST", path, json.dumps(body), h)
        response = self.conn.getresponse()
        data = response.read()
        return response.status, data


def chat(client, n, stream):
    for i in range(n):
        body = {"model": "mock", "messages": [{"role": "user", "content": f"Say hello ({i})."}],
                "max_tokens": 16}
        if stream:
            body["stream"] = True
        client.post("/v1/chat/completions", body)


def messages(client, n):
    for i in range(n):
        body = {"model": "mock", "max_tokens": 64, "stream": i % 2 == 0,
                "system": "You are a coding agent.",
                "messages": [{"role": "user", "content": f"Read file {i}."}]}
        client.post("/v1/messages", body, {"x-api-key": "sk-training",
                                           "anthropic-version": "2023-06-01"})


def responses(client, n):
    for i in range(n):
        body = {"model": "mock", "stream": i % 2 == 0, "instructions": "Be brief.",
                "input": [{"role": "user", "content": [{"type": "input_text",
                                                        "text": f"Run step {i}."}]}]}
        client.post("/v1/responses", body)


def growing_conversation(client, turns, words_per_turn, tag):
    """An agent loop past a small window: tool calls with long results, every request carrying
    the whole history, as clients send it."""
    history = [{"role": "system", "content": "You are a coding agent. " + text(200, 1)},
               {"role": "user", "content": f"Task {tag}: fix the failing tests."}]
    tools = [{"type": "function", "function": {
        "name": "read_file", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    for t in range(turns):
        call_id = f"call_{tag}_{t}"
        history.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/m{t}.py"})}}]})
        history.append({"role": "tool", "tool_call_id": call_id,
                        "content": text(words_per_turn, t)})
        client.post("/v1/chat/completions",
                    {"model": "mock-small", "messages": history, "tools": tools,
                     "stream": t % 2 == 1})


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--scale", type=float, default=1.0)
    a = ap.parse_args()

    def n(count):
        return max(1, int(count * a.scale))

    client = Client(a.url)
    chat(client, n(4000), stream=False)
    chat(client, n(2000), stream=True)
    messages(client, n(600))
    responses(client, n(600))
    for tag in range(n(6)):
        growing_conversation(client, turns=40, words_per_turn=400, tag=tag)
    # Large bodies: the parse and count of a long conversation, first seen and seen again.
    for tag in range(n(2)):
        for _ in range(3):
            growing_conversation(client, turns=60, words_per_turn=1500, tag=f"large{tag}")
    print("training requests sent")


if __name__ == "__main__":
    main()
