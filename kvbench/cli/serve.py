"""`kvbench serve`: a model over an OpenAI-compatible HTTP API, a kvbench method as its cache."""
from __future__ import annotations

import json
import sys

import click

from kvbench.cli.common import DEVICE, fail
from kvbench.config.secrets import API_KEY_ENV

MAX_BODY_BYTES = 8 << 20  # a prompt of a million tokens or more: far above any context here


@click.command()
@click.option("--model", default="bundled:smollm2-135m", show_default=True,
              help="Model spec: bundled:NAME, a local checkpoint folder, tiny:llama.")
@click.option("--method", "method_name", default="identity", show_default=True,
              help="The KV-cache method every request's cache is made of (a name from"
                   " `kvbench list methods` or module:Class).")
@click.option("--params", "params_json", default="{}", show_default=True,
              help='The method\'s parameters as JSON, e.g. \'{"bits": 3, "block": 64}\'.')
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; other than loopback only with --allow-remote.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--allow-remote", is_flag=True,
              help="Allow a --host that is not loopback; such a server needs --api-key (or"
                   " --no-auth).")
@click.option("--api-key", envvar=API_KEY_ENV, metavar="KEY",
              help=f"Serve only requests that send 'Authorization: Bearer KEY' (all routes but"
                   f" /health; others get 401), as vLLM's --api-key. Default: the environment"
                   f" variable {API_KEY_ENV}, which keeps the key out of the process list."
                   f" Needed to serve other machines (--allow-remote).")
@click.option("--no-auth", is_flag=True,
              help="Serve other machines (--allow-remote) without an API key: anyone who"
                   " reaches the port is served.")
@click.option("--device", default="auto", show_default=True, type=DEVICE, metavar="DEVICE",
              help="auto (CUDA, else MPS, else the CPU), cpu, cuda, cuda:N (the N-th CUDA"
                   " device) or mps; a device this machine lacks is refused before the model"
                   " loads.")
@click.option("--model-dtype", default="auto", show_default=True,
              type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
              help="The model's weights and activations (a cache stores in it unless its method"
                   " says otherwise); auto: the checkpoint's own dtype on CUDA and MPS, float32"
                   " on the CPU.")
@click.option("--threads", type=click.IntRange(min=1), help="torch threads (default: torch's).")
@click.option("--kv-budget", type=click.IntRange(min=1), metavar="BYTES",
              help="Admit a request only while the method's accounted KV bytes of the active"
                   " requests (each reserving its prompt + max_tokens) fit in BYTES; others wait.")
@click.option("--queue-timeout", default=600.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds a request may wait for room before it gets 503.")
@click.option("--max-batch", default=32, show_default=True, type=click.IntRange(min=1),
              help="Most requests decoded together in one batched forward.")
@click.option("--prefill-chunk", default=0, show_default=True, type=click.IntRange(min=0),
              metavar="TOKENS",
              help="Prompt tokens per prefill forward; the active requests take a decode step"
                   " between chunks, so a long prompt delays the other streams by one chunk at a"
                   " time. 0: from the model and the device's free memory, at most 512 on a CPU"
                   " and 2048 on a GPU.")
@click.option("--prefix-cache", default=0, show_default=True, type=click.IntRange(min=0),
              metavar="ENTRIES",
              help="Keep the method's cache of up to ENTRIES prompt prefixes (whole prefill"
                   " chunks, least recently used dropped first) and start a prompt that begins"
                   " with one from a copy: a shared system prompt or a conversation's earlier"
                   " turns are not prefilled again, and every answer is the same as without it."
                   " Held outside --kv-budget (/metrics: kvbench_prefix_cache_bytes); 0: off.")
@click.option("--max-body", "max_body", default=MAX_BODY_BYTES, show_default=True,
              type=click.IntRange(min=1), metavar="BYTES",
              help="Refuse request bodies above BYTES with 413, before reading the rest.")
@click.option("--calibration", default=512, show_default=True, type=click.IntRange(min=0),
              help="Tokens of offline text handed to methods that calibrate themselves.")
@click.option("--system-prompt", default=None, metavar="TEXT",
              help="A system message before every chat request's messages (a request that opens"
                   " with a system message of its own keeps it).")
@click.option("--chat-template-kwargs", "template_kwargs_json", default="{}", show_default=True,
              metavar="JSON",
              help="Extra arguments of the model's chat template for every chat request, e.g."
                   """ '{"enable_thinking": false}' for Qwen3; a request's"""
                   " chat_template_kwargs override them key by key.")
@click.option("--reasoning-parser", type=click.Choice(["think"]), default=None,
              help="think: a chat answer's <think>...</think> block (or the text up to a"
                   " </think> when the template opened the block) comes in the message's"
                   " reasoning_content, the rest in its content, as vLLM's --reasoning-parser"
                   " qwen3 / deepseek_r1 give it; usage counts every token generated. Default:"
                   " the answer's whole text in content.")
def serve(model, method_name, params_json, host, port, allow_remote, api_key, no_auth, device,
          model_dtype, threads, kv_budget, queue_timeout, max_batch, prefill_chunk, prefix_cache,
          max_body, calibration, system_prompt, template_kwargs_json, reasoning_parser):
    """Serve a model over an OpenAI-compatible HTTP API with a kvbench method as every request's
    KV cache, decoding all active requests as one batch (continuous batching).

    Endpoints: /v1/completions and /v1/chat/completions (streaming with SSE), /v1/models,
    /health, /metrics (Prometheus: active and queued requests, KV bytes held, tokens). Requests
    may set ignore_eos and return_token_ids (vLLM's extensions), and a chat request
    chat_template_kwargs (vLLM's). An answer ends at the tokenizer's end-of-sequence token or
    any id the checkpoint's generation_config.json lists (Llama 3's <|eot_id|>, Qwen's
    <|im_end|>). Chat and reasoning models (Qwen3): --chat-template-kwargs
    '{"enable_thinking": false}' asks without thinking; --reasoning-parser think returns the
    reasoning apart. Needs the [serve] extra.
    """
    from kvbench.config.extras import lacks

    params = json_object("--params", params_json)
    template_kwargs = json_object("--chat-template-kwargs", template_kwargs_json)
    missing = lacks("serve", "kvbench serve")
    if missing:
        fail(missing)
    from kvbench.models.options import ChatOptions
    from kvbench.serve.auth import check_access
    from kvbench.serve.server import serve as run_server

    try:
        check_access(host, allow_remote, api_key, no_auth)
    except ValueError as exc:
        fail(str(exc))
    try:
        run_server(model, method_name, params, host, port, device, threads, kv_budget,
                   queue_timeout, max_batch, calibration, model_dtype=model_dtype,
                   prefill_chunk=prefill_chunk, max_body_bytes=max_body,
                   prefix_cache=prefix_cache,
                   chat_options=ChatOptions(system_prompt, template_kwargs),
                   reasoning_parser=reasoning_parser, api_key=api_key,
                   log=lambda message: print(f"kvbench serve: {message}", file=sys.stderr,
                                             flush=True))
    except ValueError as exc:  # a bad method, parameter or model spec
        fail(str(exc))


def json_object(option: str, text: str) -> dict:
    """`text` as a JSON object; the command fails naming `option` otherwise."""
    try:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("must be a JSON object")
    except ValueError as exc:
        fail(f"{option}: {exc}")
    return value
