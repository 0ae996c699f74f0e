"""The OpenAI-compatible HTTP server over a rollout engine (aiohttp, on 127.0.0.1).

    GET  /v1/models                   the one model served (`model` is accepted under any name)
    POST /v1/chat/completions         messages, tools, tool_choice (auto | none), n, temperature,
                                      top_p, max_tokens / max_completion_tokens, stop, logprobs
    POST /v1/completions              prompt (a string or token ids), the same sampling fields
    stream: true on either POST       OpenAI's server-sent event chunks, sent once the answer is
                                      whole (stream.py)

Each route is served under /rollouts/<id>/ as well (or with the header X-Reinforge-Rollout):
the call is then captured in that rollout's log (capture.Call per choice, render.Turn for the
chat turns later calls may continue) and budgeted by it. A rollout that was ended (its agent hit
its deadline) is refused; a call whose client disconnected before its answer is not recorded.

Batching: requests wait in a queue; the batcher takes every request that arrives within
`window_s` of the first, groups them by sampling settings and runs one engine call a group
(`continue_ids`, each choice a row, `micro_batch_size` rows at most) in one worker thread, while
the event loop keeps accepting. Errors are OpenAI's body, {"error": {"message", "type", "param",
"code"}}, with 400 / 401 / 404 / 409 / 500 (an engine's ValueError, a request it refuses, is a
400 of that request alone); one request's error never stops the server.

Answers add three fields OpenAI clients keep as extras: `prompt_token_ids`, `weight_version`
and each choice's `token_ids` (the ids exactly as sampled).
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from aiohttp import web

from reinforge.gateway.capture import Call
from reinforge.gateway.render import (RequestError, Turn, assistant_message, encode, normalize, number, prompt_ids,
                                      request_tools)
from reinforge.gateway.answers import logprobs_body, openai_message, strip_stop
from reinforge.gateway.stream import send_stream

ROLLOUT_HEADER = "X-Reinforge-Rollout"


class GatewayError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type_, param, code


def error_response(e: GatewayError) -> web.Response:
    return web.json_response({"error": {"message": str(e), "type": e.type, "param": e.param, "code": e.code}},
                             status=e.status)


@dataclass
class RolloutLog:
    """What the gateway captured for one rollout."""

    budget: int | None = None
    """Tokens its sequence may hold after the first prompt (rollout.max_response_length); None: no limit."""
    prompt_limit: int | None = None
    """Longest first prompt (data.max_prompt_length); None: no limit."""
    calls: list[Call] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    call_turns: list[Turn | None] = field(default_factory=list)
    """Per call, its chat Turn (None: a /v1/completions call)."""
    root_len: int | None = None
    ended: bool = False
    requests: int = 0
    continued: int = 0
    disconnected: int = 0


@dataclass
class Job:
    contexts: list[list[int]]
    max_new: int
    greedy: bool
    sampling: tuple[float, int, float]
    stops: list[str]
    future: asyncio.Future
    log: RolloutLog | None = None
    """Its rollout's log (None: a call outside rollouts); an ended rollout's job is not generated."""


class Gateway:
    """The server in a daemon thread. engine: a Rollout that `continues` (lean, hf, vllm); parser: the
    run's agents.parsers parser (tag for the character tokenizer, hermes for ChatML templates).

    sampling: None honours each request's temperature / top_p (top_k: the engine's); a tuple
    (temperature, top_k, top_p) replaces them (a training run: the trainer scores the sampled
    tokens under its own distribution), counted as `overridden`. greedy: every call greedy."""

    def __init__(self, engine, tokenizer, parser, *, model_name: str = "policy", api_key: str | None = None,
                 sampling: tuple[float, int, float] | None = None, max_tokens: int | None = None,
                 window_s: float = 0.005):
        self.engine, self.tok, self.parser, self.model_name, self.api_key = engine, tokenizer, parser, model_name, api_key
        self.sampling, self.greedy, self.window_s = sampling, False, window_s
        self.max_tokens = max_tokens or engine.T
        self.version = 0
        """The weight version stamped on calls generated from now on (GatewayRollout sets it to
        the trainer's policy version: completed steps); read when a call's engine batch starts."""
        self.logs: dict[str, RolloutLog] = {}
        self.counters = {"requests": 0, "errors": 0, "overridden": 0, "engine_calls": 0, "rows": 0}
        self.lock = threading.Lock()
        self._idle = threading.Condition(self.lock)
        self._inflight = 0  # jobs queued or generating: drain() waits for none
        self._current: list[Job] = []  # the jobs the batcher holds
        self.port: int | None = None
        self._loop = self._thread = self._runner = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gateway-engine")
        from reinforge.agents.loop import StopScanner

        self._scanners: dict[tuple, StopScanner] = {}

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> int:
        """Serve on 127.0.0.1 (an ephemeral port) -> the port."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True, name="gateway")
        self._thread.start()
        if not ready.wait(30) or self.port is None:
            raise RuntimeError("the model gateway did not start on 127.0.0.1")
        return self.port

    def _serve(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._queue: asyncio.Queue = asyncio.Queue()
        app = web.Application(client_max_size=16 << 20)
        for prefix in ("", "/rollouts/{rollout}"):
            app.router.add_get(prefix + "/v1/models", self._models)
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_post(prefix + "/v1/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._batcher = loop.create_task(self._batch_loop())
        ready.set()
        loop.run_forever()

    def close(self) -> None:
        if self._loop is None:
            return
        loop = self._loop
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(30)
        self._pool.shutdown(wait=False)
        self._loop = None

    async def _shutdown(self) -> None:
        self._batcher.cancel()
        try:
            await self._batcher
        except asyncio.CancelledError:
            pass
        # requests still waiting (an interrupted round's agents) are answered, so the cleanup
        # below, which waits for every handler, does not wait for them
        waiting = list(self._current)
        while not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        for j in waiting:
            if not j.future.done():
                j.future.set_exception(GatewayError(503, "the gateway is shutting down", "server_error"))
        await self._runner.cleanup()

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait until no job is queued or generating (-> True; False at the timeout). Once every
        rollout has ended, no new job can start (ended rollouts are refused), so afterwards the
        engine's weights may change without a late call of an abandoned agent reading them."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _job_done(self, jobs: list[Job]) -> None:
        with self._idle:
            self._inflight -= len(jobs)
            self._idle.notify_all()

    def base_url(self, rollout: str | None = None) -> str:
        return f"http://127.0.0.1:{self.port}" + (f"/rollouts/{rollout}" if rollout else "") + "/v1"

    # ---- rollouts ----------------------------------------------------------------------------
    def open_rollout(self, rid: str, *, budget: int | None = None, prompt_limit: int | None = None) -> None:
        with self.lock:
            self.logs[rid] = RolloutLog(budget, prompt_limit)

    def end_rollout(self, rid: str) -> RolloutLog:
        """Refuse the rollout's later calls (one answered after this is not recorded); -> its log."""
        with self.lock:
            log = self.logs.pop(rid)
            log.ended = True
            return log

    def _log(self, request) -> RolloutLog | None:
        rid = request.match_info.get("rollout") or request.headers.get(ROLLOUT_HEADER)
        if rid is None:
            return None
        with self.lock:
            log = self.logs.get(rid)
        if log is None:
            raise GatewayError(409, f"rollout {rid!r} is not open (it ended, or was never started)",
                               code="rollout_not_open")
        return log

    # ---- handlers ----------------------------------------------------------------------------
    def _auth(self, request) -> None:
        if self.api_key and request.headers.get("Authorization", "") != f"Bearer {self.api_key}":
            raise GatewayError(401, "invalid API key", "authentication_error", code="invalid_api_key")

    async def _models(self, request):
        try:
            self._auth(request)
        except GatewayError as e:
            return error_response(e)
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                              "owned_by": "reinforge"}]})

    async def _body(self, request) -> dict:
        self._auth(request)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise GatewayError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise GatewayError(400, "the request body must be a JSON object")
        return body

    async def _chat(self, request):
        return await self._serve_request(request, chat=True)

    async def _completions(self, request):
        return await self._serve_request(request, chat=False)

    async def _serve_request(self, request, chat: bool):
        self.counters["requests"] += 1
        try:
            body = await self._body(request)
            log = self._log(request)
            if log is not None:
                log.requests += 1
            prep = self._prepare(body, log, chat)
            future = asyncio.get_running_loop().create_future()
            with self.lock:
                if log is not None and log.ended:
                    raise GatewayError(409, "the rollout ended while its request was read", code="rollout_not_open")
                self._inflight += 1
            self._queue.put_nowait(Job([prep["ids"]] * prep["n"], prep["max_new"], prep["greedy"], prep["sampling"],
                                       prep["stops"], future, log))
            rows, version = await future
            if request.transport is None or request.transport.is_closing():  # the client went away
                if log is not None:
                    log.disconnected += 1
                return web.Response(status=499)
            answer = self._answer(prep, rows, version, log, chat)
            if prep["stream"]:
                return await send_stream(request, answer, chat, prep["include_usage"])
            return web.json_response(answer)
        except RequestError as e:
            self.counters["errors"] += 1
            return error_response(GatewayError(400, str(e), param=e.param))
        except GatewayError as e:
            self.counters["errors"] += 1
            return error_response(e)
        except Exception as e:  # noqa: BLE001 - one request's failure is its answer, never the server's end
            self.counters["errors"] += 1
            return error_response(GatewayError(500, f"{type(e).__name__}: {e}", "server_error"))

    def _prepare(self, body: dict, log: RolloutLog | None, chat: bool) -> dict:
        """Validate a request and render its prompt ids (render.py) -> what the batcher and the answer need."""
        n = number(body, "n", 1, 1, 64, int)
        temperature = number(body, "temperature", 1.0, 0.0, 2.0)
        top_p = number(body, "top_p", 1.0, 0.0, 1.0)
        if top_p == 0.0:
            raise RequestError("top_p must be > 0", "top_p")
        max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_new = number(body, max_key, self.max_tokens, 1, 1 << 20, int)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
            raise RequestError("stop must be a string or a list of at most 4 non-empty strings", "stop")
        if number(body, "top_logprobs", 0, 0, 20, int) > 0:
            raise RequestError("top_logprobs > 0 is not supported: only the sampled tokens' log-probs are returned",
                               "top_logprobs")
        logprobs = body.get("logprobs")
        if not chat and logprobs not in (None, 0, False):  # completions: an int, the alternatives to list
            raise RequestError("logprobs > 0 is not supported: logprobs=0 returns the sampled tokens' log-probs",
                               "logprobs")
        stream, options = body.get("stream") or False, body.get("stream_options") or {}
        if not isinstance(stream, bool):
            raise RequestError("stream must be a boolean", "stream")
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise RequestError("stream_options must be an object with a boolean include_usage", "stream_options")
        prep = {"n": n, "stops": list(stops), "user_stops": list(stops), "stream": stream,
                "include_usage": bool(options.get("include_usage")),
                "logprobs": bool(logprobs) if chat else logprobs is not None,
                "tools": [], "messages": None, "continued": False}
        if chat:
            messages = normalize(body.get("messages"))
            tools = request_tools(body.get("tools"))
            choice = body.get("tool_choice", "auto")
            if choice not in ("auto", "none", None):
                raise RequestError(f"tool_choice={choice!r} is not supported (no constrained decoding): use auto or none",
                                   "tool_choice")
            parse_tools = tools if choice != "none" else []
            ids, cont = prompt_ids(self.tok, self.parser, messages, tools, log.turns if log is not None else [])
            prep.update(messages=messages, tools=parse_tools, continued=cont)
            if parse_tools:  # a call ends the turn, as in the agent loop
                prep["stops"] += self.parser.stop_strings({t.name: t for t in parse_tools})
        else:
            ids = self._completion_prompt(body.get("prompt"))
        prep["ids"] = ids
        self._budget(prep, log, max_new)
        if self.sampling is not None:
            if "temperature" in body or "top_p" in body:
                self.counters["overridden"] += 1
            prep["sampling"] = self.sampling
        else:
            prep["sampling"] = (temperature if temperature > 0 else 1.0, getattr(self.engine, "top_k", 0), top_p)
        prep["greedy"] = self.greedy or (self.sampling is None and temperature == 0.0)  # training: the run's
        return prep

    def _completion_prompt(self, prompt) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return encode(self.tok, prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = len(self.tok)
            if not all(0 <= t < vocab for t in prompt):
                raise RequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
            return list(prompt)
        raise RequestError("prompt must be a non-empty string or list of token ids (one prompt a request)", "prompt")

    def _budget(self, prep: dict, log: RolloutLog | None, max_new: int) -> None:
        """max_new capped by the gateway's max_tokens and, in a rollout, by what its sequence has left."""
        ids = prep["ids"]
        prep["max_new"] = min(max_new, self.max_tokens)
        if log is None:
            return
        if not prep["continued"] and log.prompt_limit is not None and len(ids) > log.prompt_limit:
            raise GatewayError(400, f"the prompt renders to {len(ids)} tokens, more than the run's "
                                    f"data.max_prompt_length={log.prompt_limit}", code="context_length_exceeded")
        if log.budget is not None:
            root = log.root_len if prep["continued"] and log.root_len is not None else len(ids)
            left = log.budget - (len(ids) - root)
            if left <= 0:
                raise GatewayError(400, f"the rollout's token budget (rollout.max_response_length={log.budget}) "
                                        "is spent", code="context_length_exceeded")
            prep["max_new"] = min(prep["max_new"], left)
        prep["root"] = None if prep["continued"] else len(ids)

    # ---- batching ----------------------------------------------------------------------------
    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = self._current = [await self._queue.get()]
            await asyncio.sleep(self.window_s)
            while not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            groups: dict[tuple, list[Job]] = {}
            for j in jobs:
                if j.log is not None and j.log.ended:  # its agent was abandoned: nobody reads the answer
                    if not j.future.done():
                        j.future.set_exception(GatewayError(409, "the rollout ended", code="rollout_not_open"))
                    self._job_done([j])
                    continue
                groups.setdefault((j.greedy, j.sampling), []).append(j)
            for (greedy, sampling), group in groups.items():
                version = self.version  # the weights that sample this group (they change between rounds only)
                try:
                    await self._run_group(loop, group, greedy, sampling, version)
                finally:
                    self._job_done(group)

    async def _run_group(self, loop, group: list[Job], greedy: bool, sampling, version: int) -> None:
        """One engine call for `group`, answering each request's future. An engine's ValueError
        is a request it refuses (vLLM: a temperature in (0, 0.01), a context beyond its
        max_model_len): that request's 400. In a group of several, each request is then tried
        alone, so that the others are answered."""
        try:
            outs = await loop.run_in_executor(self._pool, self._generate, group, greedy, sampling)
        except ValueError as e:
            if len(group) > 1:
                for j in group:
                    await self._run_group(loop, [j], greedy, sampling, version)
                return
            self._fail(group, GatewayError(400, f"the engine refused the request: {e}"))
            return
        except Exception as e:  # noqa: BLE001 - every waiting request gets the error
            self._fail(group, e)
            return
        for j, rows in zip(group, outs):
            if not j.future.done():
                j.future.set_result((rows, version))

    @staticmethod
    def _fail(group: list[Job], error: Exception) -> None:
        for j in group:
            if not j.future.done():
                j.future.set_exception(error)

    def _scanner(self, stops: list[str]):
        from reinforge.agents.loop import StopScanner

        key = tuple(stops)
        if key not in self._scanners:
            self._scanners[key] = StopScanner(self.tok, list(key))
        return self._scanners[key]

    def _generate(self, jobs: list[Job], greedy: bool, sampling) -> list[list[tuple[list[int], list[float], str]]]:
        """One engine call (per micro-batch) for every choice of `jobs` -> per job, per choice:
        (sampled ids cut at EOS / a stop string / the budget, their log-probs, finish reason)."""
        from reinforge.agents.loop import TurnStops

        rows = [(k, ctx, j.max_new, self._scanner(j.stops)) for k, j in enumerate(jobs) for ctx in j.contexts]
        eos = set(self.engine.eos_ids)
        out: list[list] = [[] for _ in jobs]
        step = max(1, getattr(self.engine, "micro_batch_size", 64))
        for i in range(0, len(rows), step):
            part = rows[i:i + step]
            stops = TurnStops([r[2] for r in part], [r[3] for r in part])
            ids, logp = self.engine.continue_ids([r[1] for r in part], max(stops.budgets), greedy=greedy,
                                                 sampling=sampling, stop=stops)
            self.counters["engine_calls"] += 1
            self.counters["rows"] += len(part)
            for row, (k, _, budget, scanner) in enumerate(part):
                turn = ids[row, :budget].tolist()
                end = next((t + 1 for t, x in enumerate(turn) if x in eos), len(turn))
                body = turn[:end]
                cut = scanner.first_cut(body)
                stopped = cut < len(body) or end < len(turn) or (bool(body) and body[-1] in eos) or \
                    (bool(scanner.stops) and scanner.hit(body[:cut]))
                finish = "stop" if stopped else "length"
                out[k].append((body[:cut], logp[row, :cut].tolist(), finish))
        return out

    # ---- answers -----------------------------------------------------------------------------
    def _answer(self, prep: dict, rows, version: int, log: RolloutLog | None, chat: bool) -> dict:
        """The OpenAI body; in a rollout, the calls (and chat turns) recorded in its log, each
        stamped with `version`, the weight version that sampled it."""
        choices, completion_tokens = [], 0
        for i, (ids, logp, finish) in enumerate(rows):
            completion_tokens += len(ids)
            lp = logprobs_body(self.tok, ids, logp, chat) if prep["logprobs"] else None
            turn = None
            if chat:
                msg, calls = assistant_message(self.tok, self.parser, ids, prep["tools"])
                if calls:
                    finish = "tool_calls"
                sent = openai_message(msg, prep["user_stops"])
                returned = {"role": "assistant", "content": sent["content"] or ""}  # as a continuing request holds it
                if msg.get("tool_calls"):
                    returned["tool_calls"] = msg["tool_calls"]
                turn = Turn(prep["messages"], returned, tuple(prep["ids"] + ids),
                            self.tok.decode(ids, skip_special_tokens=False))
                choices.append({"index": i, "finish_reason": finish, "logprobs": lp, "token_ids": ids,
                                "message": sent})
            else:
                choices.append({"index": i, "finish_reason": finish, "logprobs": lp, "token_ids": ids,
                                "text": strip_stop(self.tok.decode(ids, skip_special_tokens=True),
                                                         prep["user_stops"])})
            if log is not None:
                with self.lock:
                    if not log.ended:  # an ended rollout's late answer is not part of it
                        log.calls.append(Call(tuple(prep["ids"]), tuple(ids), tuple(logp), version, finish))
                        log.call_turns.append(turn)
                        if turn is not None:
                            log.turns.append(turn)
        if log is not None:
            with self.lock:
                if prep.get("root") is not None and log.root_len is None:
                    log.root_len = prep["root"]
                log.continued += prep["continued"]
        return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "prompt_token_ids": prep["ids"],
                "weight_version": version,
                "usage": {"prompt_tokens": len(prep["ids"]), "completion_tokens": completion_tokens,
                          "total_tokens": len(prep["ids"]) * len(rows) + completion_tokens}}
