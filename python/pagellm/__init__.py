"""pagellm: LLM inference on any GPU wgpu reaches, with a paged KV cache.

The offline API is vLLM's, so a script ports by changing its import::

    from pagellm import LLM, SamplingParams

    llm = LLM(model="models/fortunes-llama")
    for out in llm.generate(["A wise man once said"], SamplingParams(temperature=0, max_tokens=24)):
        print(out.outputs[0].text)

Beyond vLLM's offline API, ``LLM.stream`` yields tokens as they are generated and
``AsyncLLM`` streams them to ``async for``. vLLM arguments pagellm does not implement raise
``NotImplementedError`` naming the argument rather than being ignored; unknown ones raise
``TypeError`` as any Python call does. The engine runs on its own thread and every wait
releases the GIL; Ctrl-C aborts the requests being waited for.
"""

from __future__ import annotations

import asyncio
import itertools
import json as _json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, Iterable, Iterator, List, Optional, Sequence, Union

from . import _pagellm

__all__ = [
    "LLM",
    "AsyncLLM",
    "SamplingParams",
    "StructuredOutputsParams",
    "GuidedDecodingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "Delta",
    "TokenStream",
    "BeamSearchParams",
    "BeamSearchOutput",
    "BeamSearchSequence",
]

_UNSET: Any = object()


def _refuse(name: str, why: str) -> None:
    raise NotImplementedError(f"{name}: {why}")


@dataclass
class StructuredOutputsParams:
    """A constraint on the output (vLLM's ``StructuredOutputsParams``): exactly one of a
    JSON schema (a dict or its JSON text), a regular expression the whole output must
    match, a list of choices, or a Lark grammar (llguidance's dialect)."""

    json: Optional[Union[Dict[str, Any], str]] = None
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None

    def _fields(self) -> Dict[str, Any]:
        if self.json_object:
            _refuse("json_object", "give a JSON schema (json=...) instead")
        out: Dict[str, Any] = {}
        if self.json is not None:
            out["json_schema"] = _json.loads(self.json) if isinstance(self.json, str) else self.json
        if self.regex is not None:
            out["regex"] = self.regex
        if self.choice is not None:
            out["choice"] = list(self.choice)
        if self.grammar is not None:
            out["grammar"] = self.grammar
        if len(out) != 1:
            raise ValueError("set exactly one of json, regex, choice and grammar")
        return out


#: vLLM's older name for the same thing.
GuidedDecodingParams = StructuredOutputsParams


class SamplingParams:
    """How a request samples and stops, with vLLM's names and defaults (``max_tokens=16``,
    ``None`` for as many as the context leaves; ``temperature=1.0``; ``top_k`` 0 or -1 is off). The values are checked when the request
    is submitted: an impossible one raises ``ValueError`` naming it."""

    def __init__(
        self,
        n: int = 1,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        seed: Optional[int] = None,
        stop: Optional[Union[str, List[str]]] = None,
        stop_token_ids: Optional[List[int]] = None,
        ignore_eos: bool = False,
        max_tokens: Optional[int] = 16,
        logprobs: Optional[int] = None,
        structured_outputs: Optional[StructuredOutputsParams] = None,
        guided_decoding: Optional[StructuredOutputsParams] = None,
        # vLLM arguments pagellm does not implement: refused unless left at their defaults.
        best_of: Optional[int] = None,
        min_tokens: int = 0,
        prompt_logprobs: Optional[int] = None,
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        detokenize: bool = True,
        logit_bias: Any = None,
        allowed_token_ids: Any = None,
        bad_words: Any = None,
        logits_processors: Any = None,
        truncate_prompt_tokens: Optional[int] = None,
        output_kind: Any = None,
        extra_args: Any = None,
    ) -> None:
        if best_of is not None and best_of != n:
            _refuse("best_of", "generate n samples instead")
        if min_tokens:
            _refuse("min_tokens", "not supported")
        if prompt_logprobs is not None:
            _refuse("prompt_logprobs", "not supported (pagellm perplexity scores prompts)")
        if include_stop_str_in_output:
            _refuse("include_stop_str_in_output", "the text always ends before the stop string")
        if not skip_special_tokens or not spaces_between_special_tokens or not detokenize:
            _refuse("skip_special_tokens/spaces_between_special_tokens/detokenize", "not supported")
        for name, value in [
            ("logit_bias", logit_bias),
            ("allowed_token_ids", allowed_token_ids),
            ("bad_words", bad_words),
            ("logits_processors", logits_processors),
            ("truncate_prompt_tokens", truncate_prompt_tokens),
            ("output_kind", output_kind),
            ("extra_args", extra_args),
        ]:
            if value is not None:
                _refuse(name, "not supported")
        if structured_outputs is not None and guided_decoding is not None:
            raise ValueError("give structured_outputs or guided_decoding, not both")
        self.n = n
        self.presence_penalty = presence_penalty
        self.frequency_penalty = frequency_penalty
        self.repetition_penalty = repetition_penalty
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.seed = seed
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])
        self.stop_token_ids = list(stop_token_ids or [])
        self.ignore_eos = ignore_eos
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.structured_outputs = structured_outputs or guided_decoding

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"SamplingParams({fields})"

    def _request(self, prompt: str, seed: Optional[int]) -> Dict[str, Any]:
        """The request in the library's JSON shape (``pagellm::JsonRequest``)."""
        r: Dict[str, Any] = {
            "prompt": prompt,
            "n": self.n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
        }
        if self.max_tokens is not None:
            r["max_tokens"] = self.max_tokens
        if self.logprobs is not None:
            r["logprobs"] = self.logprobs
        if seed is not None:
            r["seed"] = seed
        if self.structured_outputs is not None:
            r.update(self.structured_outputs._fields())
        return r


@dataclass
class Logprob:
    """A token's log-probability, its rank among the top tokens (1 is the most likely;
    ``None`` when it was not among those asked for), and its text."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


@dataclass
class CompletionOutput:
    """One sample of a request (vLLM's ``CompletionOutput``)."""

    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[Dict[int, Logprob]]]
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A finished request (vLLM's ``RequestOutput``): its prompt, the prompt's token ids,
    and one output per sample."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool = True
    prompt_logprobs: None = None


@dataclass
class Delta:
    """A token as it is generated: its sample, id, the text it completes (possibly empty
    while a character or a possible stop string is incomplete), and its log-probability
    when the request asked for logprobs."""

    index: int
    token_id: int
    text: str
    logprob: Optional[float] = None


@dataclass
class BeamSearchParams:
    """vLLM's beam search parameters: ``beam_width`` beams, each at most ``max_tokens``
    long, finished hypotheses scored ``cum_logprob / length ** length_penalty``. Beam
    search is deterministic: ``temperature`` must stay 0."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def _request(self, prompt: str) -> Dict[str, Any]:
        if self.include_stop_str_in_output:
            _refuse("include_stop_str_in_output", "not supported")
        return {
            "prompt": prompt,
            "n": self.beam_width,
            "beam_width": self.beam_width,
            "max_tokens": self.max_tokens,
            "ignore_eos": self.ignore_eos,
            "temperature": self.temperature,
            "length_penalty": self.length_penalty,
        }


@dataclass
class BeamSearchSequence:
    """One hypothesis: the prompt's tokens and its own (``tokens``), its cumulative
    log-probability, the prompt's text and its own (``text``) and why it ended."""

    tokens: List[int]
    logprobs: List[Dict[int, Logprob]]
    cum_logprob: float
    text: Optional[str] = None
    finish_reason: Optional[str] = None


@dataclass
class BeamSearchOutput:
    """A prompt's hypotheses, best first."""

    sequences: List[BeamSearchSequence]


Prompt = Union[str, List[int], Dict[str, Any]]


def _prompt_parts(prompt: Prompt) -> "tuple[str, Optional[List[int]], Optional[str]]":
    """The request's text (empty for token ids), its token ids if given, and the text to
    report as ``RequestOutput.prompt``."""
    if isinstance(prompt, str):
        return prompt, None, prompt
    if isinstance(prompt, dict):
        unknown = set(prompt) - {"prompt", "prompt_token_ids"}
        if unknown:
            _refuse(", ".join(sorted(unknown)), "prompt fields other than prompt and prompt_token_ids")
        if "prompt_token_ids" in prompt:
            return "", [int(t) for t in prompt["prompt_token_ids"]], prompt.get("prompt")
        return str(prompt["prompt"]), None, str(prompt["prompt"])
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return "", list(prompt), None
    raise TypeError(f"a prompt is a str, a list of token ids or a dict, not {type(prompt).__name__}")


class TokenStream:
    """A request's tokens as they come (``Delta``s); ``output`` is the ``RequestOutput``
    once the iteration has ended. Leaving a ``with`` block or calling ``abort`` ends the
    request early (its outputs finish with reason ``abort``)."""

    def __init__(self, llm: "LLM", stream: Any, prompt: Optional[str], params: SamplingParams) -> None:
        self._llm = llm
        self._stream = stream
        self._prompt = prompt
        self._params = params
        self.output: Optional[RequestOutput] = None

    def __iter__(self) -> Iterator[Delta]:
        while self.output is None:
            event = self._stream.next(None)
            delta = self._take(event)
            if delta is not None:
                yield delta

    def _take(self, event: Any) -> Optional[Delta]:
        kind = event[0]
        if kind == "token":
            _, index, token_id, text, logprob, _top = event
            return Delta(index, token_id, text, logprob)
        if kind == "finished":
            self.output = self._llm._output(event[1], self._prompt, self._params)
            return None
        raise RuntimeError("the engine stopped before the request finished")

    def abort(self) -> None:
        self._stream.abort()

    def __enter__(self) -> "TokenStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.output is None:
            self.abort()


class LLM:
    """A model loaded on a GPU with its engine (vLLM's ``LLM``).

    ``model`` is a Hugging Face folder or a ``.gguf`` file. vLLM's engine arguments that
    pagellm has map to its options (``max_model_len``, ``max_num_seqs``,
    ``max_num_batched_tokens``, ``block_size``, ``enable_prefix_caching``,
    ``kv_cache_dtype`` as ``auto``, ``f32``, ``f16``, ``int8`` or ``int4``, ``swap_space`` in
    GiB, ``num_gpu_blocks_override``); ``seed`` makes requests without a seed of their own
    reproducible. pagellm's own: ``kv_cache_bytes``, ``kv_memory_fraction`` (the share of
    the GPU memory free after the weights that a KV cache given no size takes, 0.8),
    ``num_gpu_blocks``,
    ``num_cpu_blocks``, ``weight_dtype`` (``q8_0``, ``q4_k``, ...), ``kv_cache_dir``,
    ``preemption_mode`` and ``backends`` (``"vulkan"``, ``"gl"``, ...). Options that change
    nothing here (``trust_remote_code``, ``enforce_eager``, ``disable_log_stats``) are
    accepted; the others raise ``NotImplementedError``.
    """

    def __init__(
        self,
        model: str,
        *,
        tokenizer: Optional[str] = None,
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        quantization: Optional[str] = None,
        revision: Optional[str] = None,
        tokenizer_revision: Optional[str] = None,
        seed: Optional[int] = None,
        gpu_memory_utilization: Optional[float] = None,
        swap_space: Optional[float] = None,
        cpu_offload_gb: float = 0,
        enforce_eager: bool = False,
        max_model_len: Optional[int] = None,
        max_num_seqs: Optional[int] = None,
        max_num_batched_tokens: Optional[int] = None,
        block_size: Optional[int] = None,
        enable_prefix_caching: bool = True,
        kv_cache_dtype: str = "auto",
        num_gpu_blocks_override: Optional[int] = None,
        disable_log_stats: bool = True,
        kv_cache_bytes: Optional[int] = None,
        kv_memory_fraction: Optional[float] = None,
        num_gpu_blocks: Optional[int] = None,
        num_cpu_blocks: Optional[int] = None,
        weight_dtype: Optional[str] = None,
        kv_cache_dir: Optional[str] = None,
        preemption_mode: Optional[str] = None,
        backends: Optional[str] = None,
    ) -> None:
        del trust_remote_code, enforce_eager, disable_log_stats  # no effect here
        if tokenizer is not None and tokenizer != model:
            _refuse("tokenizer", "pagellm reads the model's own tokenizer")
        if skip_tokenizer_init:
            _refuse("skip_tokenizer_init", "not supported")
        if tensor_parallel_size != 1:
            _refuse("tensor_parallel_size", "pagellm runs a model on one GPU")
        if dtype != "auto":
            _refuse("dtype", "weights stay as stored (or weight_dtype=...); pagellm computes in f32")
        if quantization is not None:
            _refuse("quantization", "give weight_dtype= (q8_0, q4_k, ...) or a GGUF file")
        if revision is not None or tokenizer_revision is not None:
            _refuse("revision", "pagellm loads local folders and files")
        if gpu_memory_utilization is not None:
            _refuse(
                "gpu_memory_utilization",
                "the KV cache takes kv_memory_fraction of the memory free after the weights, "
                "or give kv_cache_bytes or num_gpu_blocks",
            )
        if cpu_offload_gb:
            _refuse("cpu_offload_gb", "not supported")
        if num_gpu_blocks_override is not None:
            num_gpu_blocks = num_gpu_blocks_override
        kv_dtype = None
        if kv_cache_dtype != "auto":
            if kv_cache_dtype.startswith("fp8"):
                _refuse("kv_cache_dtype", "fp8 is not supported; int8 and int4 are")
            kv_dtype = kv_cache_dtype
        options = {
            "block_size": block_size,
            "num_gpu_blocks": num_gpu_blocks,
            "kv_cache_bytes": kv_cache_bytes,
            "kv_memory_fraction": kv_memory_fraction,
            "num_cpu_blocks": num_cpu_blocks,
            "swap_space_bytes": None if swap_space is None else int(swap_space * (1 << 30)),
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "kv_dtype": kv_dtype,
            "weight_dtype": weight_dtype,
            "enable_prefix_caching": enable_prefix_caching,
            "kv_cache_dir": kv_cache_dir,
            "preemption_mode": preemption_mode,
            "backends": backends,
        }
        options = {k: v for k, v in options.items() if v is not None}
        self._engine = _pagellm.Engine(str(model), _json.dumps(options))
        self._seeds = None if seed is None else itertools.count(seed)
        self._decoded: Dict[int, str] = {}

    # ---- requests ------------------------------------------------------------------

    def _submit(self, prompts: Sequence[Prompt], params: Sequence[SamplingParams]) -> List[Any]:
        requests = []
        for prompt, p in zip(prompts, params):
            text, ids, _ = _prompt_parts(prompt)
            seed = p.seed if p.seed is not None or self._seeds is None else next(self._seeds)
            request = p._request(text, seed)
            if p.max_tokens is None:
                # vLLM's None: as many as the context leaves after the prompt.
                used = len(ids) if ids is not None else len(self.encode(text))
                request["max_tokens"] = max(self.max_model_len - used, 0)
            requests.append((_json.dumps(request), ids))
        return self._engine.submit_all(requests)

    def _params_for(self, n: int, sampling_params: Any) -> List[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * n
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * n
        params = list(sampling_params)
        if len(params) != n:
            raise ValueError(f"{len(params)} sampling params for {n} prompts")
        return params

    def generate(
        self,
        prompts: Union[Prompt, Sequence[Prompt]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        *,
        use_tqdm: bool = True,
        lora_request: Any = None,
        priority: Any = None,
    ) -> List[RequestOutput]:
        """Runs every prompt (batched together) and returns their outputs in order.
        ``sampling_params`` is one for all or one per prompt. ``use_tqdm`` is accepted
        and shows nothing."""
        del use_tqdm
        if lora_request is not None:
            _refuse("lora_request", "adapters are not supported yet")
        if priority is not None:
            _refuse("priority", "requests run first come, first served")
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        params = self._params_for(len(prompts), sampling_params)
        streams = self._submit(prompts, params)
        try:
            return [
                self._collect(s, _prompt_parts(pr)[2], p) for s, pr, p in zip(streams, prompts, params)
            ]
        finally:
            for s in streams:  # after Ctrl-C or an error: nothing keeps running
                s.abort()

    def _collect(self, stream: Any, prompt: Optional[str], params: Optional[SamplingParams]) -> RequestOutput:
        while True:
            event = stream.next(None)
            if event[0] == "finished":
                return self._output(event[1], prompt, params)
            if event[0] == "end":
                raise RuntimeError("the engine stopped before the request finished")

    def chat(
        self,
        messages: Union[List[Dict[str, Any]], List[List[Dict[str, Any]]]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        *,
        use_tqdm: bool = True,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Any = None,
        chat_template_kwargs: Any = None,
    ) -> List[RequestOutput]:
        """Renders each conversation with the model's chat template and generates its
        reply. ``messages`` is one conversation (a list of ``{"role", "content"}``) or a
        list of them."""
        if chat_template is not None:
            _refuse("chat_template", "pagellm uses the model's own template")
        if continue_final_message:
            _refuse("continue_final_message", "not supported")
        if tools is not None or chat_template_kwargs is not None:
            _refuse("tools/chat_template_kwargs", "not supported by LLM.chat yet (the server has tools)")
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts: List[Prompt] = []
        for conversation in conversations:
            text, ids = self._engine.render_chat(_json.dumps(conversation), add_generation_prompt)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def beam_search(
        self, prompts: Sequence[Prompt], params: BeamSearchParams
    ) -> List[BeamSearchOutput]:
        """Beam search over each prompt (batched together): its best ``beam_width``
        hypotheses, best first (vLLM's ``LLM.beam_search``)."""
        requests = []
        for prompt in prompts:
            text, ids, _ = _prompt_parts(prompt)
            requests.append((_json.dumps(params._request(text)), ids))
        streams = self._engine.submit_all(requests)
        outputs = []
        try:
            for stream, prompt in zip(streams, prompts):
                shown = _prompt_parts(prompt)[2]
                out = self._collect(stream, shown, None)
                outputs.append(
                    BeamSearchOutput(
                        [
                            BeamSearchSequence(
                                tokens=out.prompt_token_ids + o.token_ids,
                                logprobs=[],
                                cum_logprob=float(o.cumulative_logprob or 0.0),
                                text=(shown or "") + o.text,
                                finish_reason=o.finish_reason,
                            )
                            for o in out.outputs
                        ]
                    )
                )
        finally:
            for s in streams:
                s.abort()
        return outputs

    def stream(self, prompt: Prompt, sampling_params: Optional[SamplingParams] = None) -> TokenStream:
        """One request whose tokens are yielded as they are generated (see
        ``TokenStream``)."""
        params = sampling_params or SamplingParams()
        (stream,) = self._submit([prompt], [params])
        return TokenStream(self, stream, _prompt_parts(prompt)[2], params)

    # ---- outputs -------------------------------------------------------------------

    def _decode_one(self, token_id: int) -> str:
        text = self._decoded.get(token_id)
        if text is None:
            text = self._engine.decode([token_id], False)
            self._decoded[token_id] = text
        return text

    def _output(self, output_json: str, prompt: Optional[str], params: Optional[SamplingParams]) -> RequestOutput:
        """The engine's output as vLLM's. Per-token logprobs and the cumulative one are
        given when `params` asked for logprobs; `params` None (beam search) gives the
        cumulative one alone."""
        raw = _json.loads(output_json)
        outputs = []
        asked = params is not None and params.logprobs is not None
        for o in raw["outputs"]:
            logprobs = None
            if asked:
                logprobs = []
                for lp in o.get("logprobs", []):
                    entry: Dict[int, Logprob] = {}
                    for rank, (tid, value) in enumerate(lp["top"], 1):
                        entry[tid] = Logprob(value, rank, self._decode_one(tid))
                    chosen = lp["token_id"]
                    if chosen not in entry:
                        entry[chosen] = Logprob(lp["logprob"], None, self._decode_one(chosen))
                    # The chosen token first, as vLLM orders them.
                    entry = {chosen: entry[chosen], **{k: v for k, v in entry.items() if k != chosen}}
                    logprobs.append(entry)
            outputs.append(
                CompletionOutput(
                    index=o["index"],
                    text=o["text"],
                    token_ids=list(o["token_ids"]),
                    cumulative_logprob=o["cumulative_logprob"] if asked or params is None else None,
                    logprobs=logprobs,
                    finish_reason=o["finish_reason"],
                )
            )
        return RequestOutput(
            request_id=str(raw["request_id"]),
            prompt=prompt,
            prompt_token_ids=list(raw["prompt_token_ids"]),
            outputs=outputs,
        )

    # ---- the rest ------------------------------------------------------------------

    def encode(self, text: str) -> List[int]:
        """``text`` as token ids (special tokens added as the model's tokenizer says)."""
        return self._engine.encode(text)

    def decode(self, token_ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._engine.decode(list(token_ids), skip_special_tokens)

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    def stats(self) -> Dict[str, Any]:
        """KV cache and scheduler figures: blocks total, used and cached, the pool's bytes,
        prefix-cache hits, preemptions, steps, lost GPU devices and recoveries."""
        return _json.loads(self._engine.stats_json())

    def set_kv_budget(self, bytes: int) -> Dict[str, Any]:
        """Resizes the GPU KV cache to ``bytes`` while requests run (give GPU memory back to
        another program, or take more): running requests holding blocks beyond the new
        size are preempted and resume with the same outputs. Returns the blocks and bytes
        before and after and the requests preempted; a size below one sequence at the full
        context raises ``ValueError`` and changes nothing."""
        return _json.loads(self._engine.set_kv_budget(int(bytes)))

    def shutdown(self) -> None:
        """Stops the engine (pending requests end aborted); the object is unusable after."""
        self._engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


class AsyncLLM:
    """The engine for asyncio: ``stream`` is an async iterator of ``Delta``s and
    ``generate`` an awaitable ``RequestOutput``; the waits run on a worker thread, so the
    event loop stays free. Cancelling the awaiting task aborts the request. Takes the same
    arguments as ``LLM`` (loading blocks; construct it before the loop or in a thread)."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.llm = LLM(model, **kwargs)

    @classmethod
    def from_llm(cls, llm: LLM) -> "AsyncLLM":
        """Streams from an ``LLM`` already loaded (both may be used at once)."""
        self = cls.__new__(cls)
        self.llm = llm
        return self

    async def stream(self, prompt: Prompt, sampling_params: Optional[SamplingParams] = None) -> AsyncIterator[Delta]:
        """The request's tokens as they are generated."""
        async for delta in self._drive(self.llm.stream(prompt, sampling_params)):
            yield delta

    async def generate(self, prompt: Prompt, sampling_params: Optional[SamplingParams] = None) -> RequestOutput:
        """The request's finished output."""
        tokens = self.llm.stream(prompt, sampling_params)
        async for _ in self._drive(tokens):
            pass
        assert tokens.output is not None
        return tokens.output

    @staticmethod
    async def _drive(tokens: TokenStream) -> AsyncIterator[Delta]:
        try:
            while tokens.output is None:
                event = await asyncio.to_thread(tokens._stream.next, 0.25)
                if event is None:
                    continue
                delta = tokens._take(event)
                if delta is not None:
                    yield delta
        finally:
            if tokens.output is None:
                tokens.abort()

    def shutdown(self) -> None:
        self.llm.shutdown()
