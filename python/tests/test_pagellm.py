"""The Python package on the shipped model (GPU: the default adapter; lavapipe in CI).

Greedy and seeded outputs (token ids and logprobs) equal what ``pagellm generate --json``
prints for the same requests, and greedy ones transformers' reference tokens; n > 1,
stop strings, constraints, streaming with an abort, asyncio streaming, chat through a chat
template, Ctrl-C, the GIL released while the engine works, and clear errors for bad and
unsupported arguments.
"""

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import threading
import time

import pytest

import pagellm
from pagellm import LLM, AsyncLLM, BeamSearchParams, SamplingParams, StructuredOutputsParams

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "fortunes-llama"
EXPECTED = json.loads((MODEL / "expected.json").read_text())["cases"]


@pytest.fixture(scope="module")
def llm():
    engine = LLM(str(MODEL), num_gpu_blocks=256)
    yield engine
    engine.shutdown()


def cli_outputs(requests, tmp_path):
    """What the command line prints for `requests` (one JSON object per line)."""
    cli = pathlib.Path(os.environ.get("PAGELLM_CLI", REPO / "target" / "debug" / "pagellm"))
    if not cli.exists():
        if os.environ.get("PAGELLM_REQUIRE_CLI"):
            pytest.fail(f"no pagellm binary at {cli}")
        pytest.skip(f"no pagellm binary at {cli} (build it, or set PAGELLM_CLI)")
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    out = subprocess.run(
        [str(cli), "generate", "--model", str(MODEL), "--prompts-file", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_greedy_tokens_and_logprobs_equal_transformers_and_the_cli(llm, tmp_path):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=3)
    prompts = [c["prompt"] for c in EXPECTED]
    outs = llm.generate(prompts, params)
    for case, out in zip(EXPECTED, outs):
        assert out.prompt == case["prompt"]
        assert out.prompt_token_ids == case["prompt_ids"]
        assert out.outputs[0].token_ids == case["greedy_ids"]
        assert out.outputs[0].text == case["greedy_text"]
        assert out.outputs[0].finish_reason == "length"
    cli = cli_outputs(
        [{"prompt": p, "temperature": 0, "max_tokens": 16, "ignore_eos": True, "logprobs": 3} for p in prompts],
        tmp_path,
    )
    for out, c in zip(outs, cli):
        o, co = out.outputs[0], c["outputs"][0]
        assert o.token_ids == co["token_ids"]
        assert len(o.logprobs) == len(co["logprobs"]) == 16
        for mine, theirs in zip(o.logprobs, co["logprobs"]):
            chosen = next(iter(mine))
            assert chosen == theirs["token_id"]
            assert mine[chosen].logprob == theirs["logprob"]
            assert {t: mine[t].logprob for t, _ in theirs["top"]} == {t: lp for t, lp in theirs["top"]}
            assert [mine[t].rank for t, _ in theirs["top"]] == [1, 2, 3]
        assert o.cumulative_logprob == pytest.approx(sum(lp["logprob"] for lp in co["logprobs"]))


def test_seeded_samples_equal_the_cli(llm, tmp_path):
    request = {"prompt": "A wise man once said", "n": 3, "temperature": 0.8, "top_p": 0.95,
               "seed": 7, "max_tokens": 12, "ignore_eos": True}
    params = SamplingParams(n=3, temperature=0.8, top_p=0.95, seed=7, max_tokens=12, ignore_eos=True)
    (out,) = llm.generate(request["prompt"], params)
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert all(len(o.token_ids) == 12 for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1, "three samples came out equal"
    (cli,) = cli_outputs([request], tmp_path)
    assert [o.token_ids for o in out.outputs] == [o["token_ids"] for o in cli["outputs"]]
    # The same seed again, batched with another request: the same samples.
    (again, _) = llm.generate([request["prompt"], "Once upon a time"], [params, SamplingParams(max_tokens=5)])
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in out.outputs]


def test_beam_search_equals_the_cli(llm, tmp_path):
    prompt = EXPECTED[1]["prompt"]
    (out,) = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True))
    assert len(out.sequences) == 3
    (cli,) = cli_outputs(
        [{"prompt": prompt, "n": 3, "beam_width": 3, "temperature": 0, "max_tokens": 8, "ignore_eos": True}],
        tmp_path,
    )
    prompt_ids = EXPECTED[1]["prompt_ids"]
    for seq, theirs in zip(out.sequences, cli["outputs"]):
        assert seq.tokens == prompt_ids + theirs["token_ids"]
        assert seq.text == prompt + theirs["text"]
        assert seq.cum_logprob == pytest.approx(theirs["cumulative_logprob"])
    scores = [s.cum_logprob / (len(s.tokens) - len(prompt_ids)) for s in out.sequences]
    assert scores == sorted(scores, reverse=True), "not best first"
    with pytest.raises(ValueError, match="temperature"):
        llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=4, temperature=0.7))


def test_max_tokens_none_fills_the_context():
    short = LLM(str(MODEL), max_model_len=24)
    try:
        (out,) = short.generate(EXPECTED[0]["prompt"], SamplingParams(max_tokens=None, ignore_eos=True, seed=5))
        assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 24
        assert out.outputs[0].finish_reason == "length"
    finally:
        short.shutdown()


def test_stop_strings_and_constraints(llm):
    greedy = dict(temperature=0, max_tokens=16, ignore_eos=True)
    (out,) = llm.generate(EXPECTED[0]["prompt"], SamplingParams(stop=[" thing"], **greedy))
    assert (out.outputs[0].text, out.outputs[0].finish_reason) == (" a good", "stop")
    choice = SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    (out,) = llm.generate("Is it true?", choice)
    assert out.outputs[0].text in ("yes", "no")
    digits = SamplingParams(max_tokens=8, seed=3, guided_decoding=pagellm.GuidedDecodingParams(regex="[0-9]{3}"))
    (out,) = llm.generate("The number is", digits)
    assert len(out.outputs[0].text) == 3 and out.outputs[0].text.isdigit()


def test_a_stream_yields_tokens_and_an_abort_ends_it(llm):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    stream = llm.stream(EXPECTED[0]["prompt"], params)
    deltas = list(stream)
    assert [d.token_id for d in deltas] == EXPECTED[0]["greedy_ids"]
    assert "".join(d.text for d in deltas) == EXPECTED[0]["greedy_text"]
    assert stream.output.outputs[0].token_ids == EXPECTED[0]["greedy_ids"]
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    with llm.stream("Once upon a time", long) as stream:
        taken = 0
        for _ in stream:
            taken += 1
            if taken == 3:
                stream.abort()
    out = stream.output.outputs[0]
    assert out.finish_reason == "abort" and 3 <= len(out.token_ids) < 200


def test_asyncio_streams_concurrently(llm):
    async_llm = AsyncLLM.from_llm(llm)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)

    async def text_of(prompt):
        return "".join([d.text async for d in async_llm.stream(prompt, params)])

    async def main():
        texts = await asyncio.gather(*(text_of(c["prompt"]) for c in EXPECTED))
        out = await async_llm.generate(EXPECTED[0]["prompt"], params)
        return texts, out

    texts, out = asyncio.run(main())
    assert texts == [c["greedy_text"] for c in EXPECTED]
    assert out.outputs[0].token_ids == EXPECTED[0]["greedy_ids"]


def test_chat_renders_the_models_template(llm, tmp_path):
    with pytest.raises(ValueError, match="template"):
        llm.chat([{"role": "user", "content": "Hi"}])
    folder = tmp_path / "chat-model"
    folder.mkdir()
    for f in MODEL.iterdir():
        (folder / f.name).symlink_to(f)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    chat_llm = LLM(str(folder))
    try:
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        messages = [{"role": "system", "content": "Be wise."}, {"role": "user", "content": "Say something"}]
        (out,) = chat_llm.chat(messages, params)
        assert out.prompt == "<system>Be wise.\n<user>Say something\n<assistant>"
        (same,) = llm.generate({"prompt_token_ids": out.prompt_token_ids}, params)
        assert same.outputs[0].token_ids == out.outputs[0].token_ids
        assert len(chat_llm.chat([messages, messages[1:]], params)) == 2
    finally:
        chat_llm.shutdown()


def test_the_gil_is_released_while_the_engine_works(llm):
    done = threading.Event()
    params = SamplingParams(max_tokens=64, ignore_eos=True, seed=1)
    worker = threading.Thread(target=lambda: (llm.generate(["Once upon a time"] * 4, params), done.set()))
    worker.start()
    spins = 0
    while not done.is_set():
        spins += 1
    worker.join()
    assert spins > 1000, f"the main thread ran {spins} times while the engine worked"


def test_ctrl_c_aborts_the_requests_and_the_engine_goes_on(llm):
    # Far more work than 0.3 s of it on any adapter (32 x 300 tokens, over a pool that must
    # preempt), so that the interrupt lands while the requests run.
    # Python raises KeyboardInterrupt only where SIGINT was not ignored when it started (a job
    # run in the background from a script inherits it ignored): ask for it here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    params = SamplingParams(max_tokens=300, ignore_eos=True, seed=2)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(["Once upon a time"] * 32, params)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    for _ in range(100):
        if llm.stats()["pending_requests"] == 0:
            break
        time.sleep(0.05)
    assert llm.stats()["pending_requests"] == 0
    (out,) = llm.generate(EXPECTED[0]["prompt"], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert out.outputs[0].token_ids == EXPECTED[0]["greedy_ids"]


def test_bad_and_unsupported_arguments_are_clear_errors(llm):
    with pytest.raises(ValueError, match="top_p"):
        llm.generate("x", SamplingParams(top_p=1.5))
    with pytest.raises(ValueError, match="context"):
        llm.generate("x", SamplingParams(max_tokens=100000))
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate({"prompt_token_ids": [999999]})
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate(["x"], [SamplingParams(), SamplingParams()])
    with pytest.raises(ValueError, match="exactly one"):
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a", choice=["b"]))._request("", None)
    with pytest.raises(TypeError):
        SamplingParams(temprature=1)
    with pytest.raises(NotImplementedError, match="best_of"):
        SamplingParams(n=1, best_of=3)
    with pytest.raises(NotImplementedError, match="min_tokens"):
        SamplingParams(min_tokens=4)
    with pytest.raises(NotImplementedError, match="gpu_memory_utilization"):
        LLM(str(MODEL), gpu_memory_utilization=0.9)
    with pytest.raises(ValueError, match="kv_memory_fraction"):
        LLM(str(MODEL), kv_memory_fraction=1.5)
    with pytest.raises(NotImplementedError, match="quantization"):
        LLM(str(MODEL), quantization="awq")
    with pytest.raises(NotImplementedError, match="lora_request"):
        llm.generate("x", lora_request=object())
    with pytest.raises(RuntimeError, match="/no/such/model"):
        LLM("/no/such/model")
    with pytest.raises(ValueError, match="kv_dtype"):
        LLM(str(MODEL), kv_cache_dtype="f99")
    # A refused request in a batch: none of the batch runs, and the engine is idle.
    with pytest.raises(ValueError, match="request 1"):
        llm.generate(["x", "y"], [SamplingParams(), SamplingParams(temperature=-1)])
    for _ in range(100):
        if llm.stats()["pending_requests"] == 0:
            break
        time.sleep(0.05)
    assert llm.stats()["pending_requests"] == 0


def test_the_kv_budget_shrinks_and_grows_without_changing_outputs():
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [c["prompt"] for c in EXPECTED]
    with LLM(str(MODEL), num_gpu_blocks=128) as llm:
        before = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        block = llm.stats()["kv_pool_bytes"] // 128
        assert block == 32768  # 4 layers x K and V x 2 heads x 64 x 16 tokens x f16
        r = llm.set_kv_budget(40 * block)
        assert (r["blocks_before"], r["blocks_after"]) == (128, 40)
        assert llm.stats()["kv_blocks_total"] == 40
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == before
        with pytest.raises(ValueError, match="32"):
            llm.set_kv_budget(4 * block)
        assert llm.stats()["kv_blocks_total"] == 40
        assert llm.set_kv_budget(128 * block)["blocks_after"] == 128
        assert llm.stats()["device_losses"] == 0
