/*
 * pagellm's C API from C: loading, greedy and sampled requests, n > 1, structured output
 * by JSON, abort mid-stream, a request freed mid-stream, timeouts, statistics, and every
 * kind of bad input (null pointers, text that is not UTF-8, bad parameters, unknown
 * fields, freed and foreign handles). tests/c_api.rs builds it with AddressSanitizer and
 * LeakSanitizer and runs it on the shipped model:
 *
 *   test_capi MODEL_DIR EXPECTED_GREEDY_IDS...
 *
 * where the ids are transformers' greedy tokens for "The meaning of life is". Prints
 * "ok" and exits 0 when every check passed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagellm.h"

static int failures = 0;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, " (last error: %s)\n", pagellm_last_error());       \
            failures++;                                                          \
        }                                                                        \
    } while (0)

static int contains(const char *haystack, const char *needle) {
    return haystack != NULL && strstr(haystack, needle) != NULL;
}

/* What a request produced, read to its end. */
typedef struct {
    pagellm_status status; /* END, or the error that ended it */
    uint32_t ids[2][512];  /* token ids of samples 0 and 1 */
    size_t len[2];
    size_t finished; /* FINISHED events */
    char reason[2][16];
    char text[2][1024]; /* FINISHED text of samples 0 and 1 */
    size_t logprobs;    /* tokens that came with a logprob */
} outcome;

static void drain(pagellm_request *r, outcome *o, size_t stop_after_tokens) {
    memset(o, 0, sizeof *o);
    pagellm_event ev;
    size_t tokens = 0;
    for (;;) {
        pagellm_status s = pagellm_request_next(r, 5000, &ev);
        if (s == PAGELLM_TIMEOUT) {
            continue;
        }
        if (s != PAGELLM_OK) {
            o->status = s;
            return;
        }
        if (ev.index > 1) {
            continue;
        }
        if (ev.kind == PAGELLM_EVENT_TOKEN) {
            CHECK(ev.finish_reason == NULL, "a token with a finish reason");
            CHECK(ev.text != NULL && ev.text[ev.text_len] == '\0', "token text");
            if (o->len[ev.index] < 512) {
                o->ids[ev.index][o->len[ev.index]++] = ev.token_id;
            }
            if (!isnan(ev.logprob)) {
                o->logprobs++;
            }
            if (++tokens == stop_after_tokens) {
                CHECK(pagellm_request_abort(r) == PAGELLM_OK, "abort");
            }
        } else {
            CHECK(ev.kind == PAGELLM_EVENT_FINISHED, "kind %d", (int)ev.kind);
            o->finished++;
            snprintf(o->reason[ev.index], sizeof o->reason[0], "%s", ev.finish_reason);
            snprintf(o->text[ev.index], sizeof o->text[0], "%s", ev.text);
            CHECK(ev.token_id == o->len[ev.index], "FINISHED says %u tokens, %zu streamed",
                  ev.token_id, o->len[ev.index]);
        }
    }
}

static void bad_inputs_before_loading(const char *model) {
    pagellm_engine *e = NULL;
    CHECK(pagellm_engine_new(NULL, &e) == PAGELLM_ERR_ARGUMENT, "null config");
    CHECK(contains(pagellm_last_error(), "config"), "message names config");
    pagellm_config c = pagellm_config_default();
    CHECK(pagellm_engine_new(&c, &e) == PAGELLM_ERR_ARGUMENT, "null model path");
    CHECK(contains(pagellm_last_error(), "model_path"), "message names model_path");
    c.model_path = model;
    CHECK(pagellm_engine_new(&c, NULL) == PAGELLM_ERR_ARGUMENT, "null out");
    c.kv_dtype = "f99";
    CHECK(pagellm_engine_new(&c, &e) == PAGELLM_ERR_ARGUMENT, "unknown kv dtype");
    CHECK(contains(pagellm_last_error(), "f99"), "message names the dtype");
    c.kv_dtype = NULL;
    c.model_path = "\xff\xfe";
    CHECK(pagellm_engine_new(&c, &e) == PAGELLM_ERR_ARGUMENT, "model path not UTF-8");
    CHECK(contains(pagellm_last_error(), "UTF-8"), "message says UTF-8");
    c.model_path = "/no/such/model";
    CHECK(pagellm_engine_new(&c, &e) == PAGELLM_ERR_LOAD, "missing model");
    CHECK(contains(pagellm_last_error(), "/no/such/model"), "message names the path");
    c.model_path = model;
    c.backends = "vulcan";
    CHECK(pagellm_engine_new(&c, &e) == PAGELLM_ERR_ARGUMENT, "unknown backend");
    CHECK(contains(pagellm_last_error(), "vulcan"), "message names the backend");
    CHECK(e == NULL, "no engine handed out on errors");
}

static void greedy_matches(pagellm_engine *e, const uint32_t *want, size_t n_want) {
    pagellm_sampling p = pagellm_sampling_default();
    p.temperature = 0.0f;
    p.max_tokens = (uint32_t)n_want;
    p.ignore_eos = 1;
    p.logprobs = 2;
    pagellm_request *r = NULL;
    CHECK(pagellm_submit(e, "The meaning of life is", &p, &r) == PAGELLM_OK, "submit");
    char *json = NULL;
    CHECK(pagellm_request_output_json(r, &json) == PAGELLM_ERR_REQUEST, "output before the end");
    outcome o;
    drain(r, &o, 0);
    CHECK(o.status == PAGELLM_END, "status %d", (int)o.status);
    CHECK(o.len[0] == n_want, "%zu tokens", o.len[0]);
    for (size_t i = 0; i < n_want && i < o.len[0]; i++) {
        CHECK(o.ids[0][i] == want[i], "token %zu: %u, transformers %u", i, o.ids[0][i], want[i]);
    }
    CHECK(o.finished == 1 && strcmp(o.reason[0], "length") == 0, "finished: %s", o.reason[0]);
    CHECK(o.logprobs == n_want, "%zu tokens with logprobs", o.logprobs);
    CHECK(pagellm_request_output_json(r, &json) == PAGELLM_OK, "output json");
    CHECK(contains(json, "\"token_ids\":[") && contains(json, "\"prompt_token_ids\":[0,319"),
          "%s", json);
    pagellm_string_free(json);
    /* The end is sticky. */
    pagellm_event ev;
    CHECK(pagellm_request_next(r, 0, &ev) == PAGELLM_END, "END again");
    pagellm_request_free(r);
    /* A freed request is unknown, not undefined behaviour. */
    CHECK(pagellm_request_next(r, 0, &ev) == PAGELLM_ERR_HANDLE, "freed request");
    CHECK(contains(pagellm_last_error(), "freed"), "message says freed");
    CHECK(pagellm_request_abort(r) == PAGELLM_ERR_HANDLE, "abort a freed request");
    pagellm_request_free(r); /* twice: ignored */
}

static void sampled_and_json(pagellm_engine *e) {
    /* n = 2, seeded: two FINISHED events, and the same seed gives the same tokens. */
    const char *json = "{\"prompt\": \"A wise man once said\", \"n\": 2, \"temperature\": 0.9,"
                       " \"seed\": 11, \"max_tokens\": 12, \"ignore_eos\": true}";
    outcome a, b;
    pagellm_request *r = NULL;
    CHECK(pagellm_submit_json(e, json, &r) == PAGELLM_OK, "submit json");
    drain(r, &a, 0);
    pagellm_request_free(r);
    CHECK(pagellm_submit_json(e, json, &r) == PAGELLM_OK, "submit json again");
    drain(r, &b, 0);
    pagellm_request_free(r);
    CHECK(a.status == PAGELLM_END && a.finished == 2, "%d, %zu finished", (int)a.status, a.finished);
    CHECK(a.len[0] == 12 && a.len[1] == 12, "%zu and %zu tokens", a.len[0], a.len[1]);
    CHECK(memcmp(a.ids, b.ids, sizeof a.ids) == 0, "the same seed gave other tokens");

    /* A constraint by JSON: the text is one of the choices. */
    const char *choice = "{\"prompt\": \"Is it true?\", \"choice\": [\"yes\", \"no\"], \"max_tokens\": 8}";
    CHECK(pagellm_submit_json(e, choice, &r) == PAGELLM_OK, "submit choice");
    drain(r, &a, 0);
    pagellm_request_free(r);
    CHECK(a.finished == 1 && (strcmp(a.text[0], "yes") == 0 || strcmp(a.text[0], "no") == 0),
          "choice gave %s", a.text[0]);

    /* Stop strings by JSON end the text before them. */
    const char *stop = "{\"prompt\": \"The meaning of life is\", \"stop\": \" thing\","
                       " \"temperature\": 0, \"max_tokens\": 16, \"ignore_eos\": true}";
    CHECK(pagellm_submit_json(e, stop, &r) == PAGELLM_OK, "submit stop");
    drain(r, &a, 0);
    pagellm_request_free(r);
    CHECK(strcmp(a.text[0], " a good") == 0 && strcmp(a.reason[0], "stop") == 0,
          "stop gave \"%s\" (%s)", a.text[0], a.reason[0]);
}

static void abort_and_free_mid_stream(pagellm_engine *e) {
    pagellm_sampling p = pagellm_sampling_default();
    p.max_tokens = 200;
    p.ignore_eos = 1;
    pagellm_request *r = NULL;
    CHECK(pagellm_submit(e, "Once upon a time", &p, &r) == PAGELLM_OK, "submit");
    outcome o;
    drain(r, &o, 3);
    CHECK(o.status == PAGELLM_END, "status %d", (int)o.status);
    CHECK(strcmp(o.reason[0], "abort") == 0, "reason %s", o.reason[0]);
    CHECK(o.len[0] >= 3 && o.len[0] < 200, "%zu tokens after the abort", o.len[0]);
    pagellm_request_free(r);

    /* Freed while running: the engine aborts it; nothing leaks (LeakSanitizer). */
    CHECK(pagellm_submit(e, "Once upon a time", &p, &r) == PAGELLM_OK, "submit");
    pagellm_event ev;
    CHECK(pagellm_request_next(r, -1, &ev) == PAGELLM_OK, "first token");
    pagellm_request_free(r);

    /* Looking without waiting: an event or a timeout, never an error. */
    CHECK(pagellm_submit(e, "Once upon a time", &p, &r) == PAGELLM_OK, "submit");
    pagellm_status s = pagellm_request_next(r, 0, &ev);
    CHECK(s == PAGELLM_TIMEOUT || s == PAGELLM_OK, "look: %d", (int)s);
    pagellm_request_free(r);
}

static void bad_requests(pagellm_engine *e) {
    pagellm_request *r = NULL;
    pagellm_sampling p = pagellm_sampling_default();
    CHECK(pagellm_submit(e, NULL, &p, &r) == PAGELLM_ERR_ARGUMENT, "null prompt");
    CHECK(pagellm_submit(e, "x", &p, NULL) == PAGELLM_ERR_ARGUMENT, "null out");
    CHECK(pagellm_submit(e, "\xc3\x28", &p, &r) == PAGELLM_ERR_ARGUMENT, "prompt not UTF-8");
    p.top_p = 1.5f;
    CHECK(pagellm_submit(e, "x", &p, &r) == PAGELLM_ERR_REQUEST, "top_p 1.5");
    CHECK(contains(pagellm_last_error(), "top_p"), "message names top_p");
    p = pagellm_sampling_default();
    p.max_tokens = 100000;
    CHECK(pagellm_submit(e, "x", &p, &r) == PAGELLM_ERR_REQUEST, "past the context");
    CHECK(pagellm_submit_json(e, "{\"prompt\": \"x\", \"temprature\": 1}", &r) == PAGELLM_ERR_REQUEST,
          "unknown field");
    CHECK(contains(pagellm_last_error(), "temprature"), "message names the field");
    CHECK(pagellm_submit_json(e, "{\"prompt\": ", &r) == PAGELLM_ERR_REQUEST, "truncated JSON");
    CHECK(pagellm_submit_json(e, "{\"prompt\": \"x\", \"regex\": \"a\", \"choice\": [\"b\"]}", &r) ==
              PAGELLM_ERR_REQUEST,
          "two constraints");
    CHECK(contains(pagellm_last_error(), "at most one"), "message says at most one");
    CHECK(r == NULL, "no request handed out on errors");
    /* Handles of the wrong kind, or none. */
    pagellm_event ev;
    CHECK(pagellm_request_next((pagellm_request *)e, 0, &ev) == PAGELLM_ERR_HANDLE, "engine as request");
    CHECK(pagellm_request_next(NULL, 0, &ev) == PAGELLM_ERR_HANDLE, "null request");
    CHECK(pagellm_submit(NULL, "x", NULL, &r) == PAGELLM_ERR_HANDLE, "null engine");
    char *json = NULL;
    CHECK(pagellm_engine_stats_json(e, &json) == PAGELLM_OK, "stats");
    CHECK(contains(json, "\"kv_blocks\"") && contains(json, "\"device_total\":64"), "%s", json);
    pagellm_string_free(json);
}

/* The live KV budget: the pool shrinks to 40 blocks (of 32 KiB) and grows back to 64, and
   the greedy tokens stay those of transformers; below one sequence (32 blocks) it is
   refused with the blocks it needs. */
static void kv_budget(pagellm_engine *e, const uint32_t *want, size_t n_want) {
    uint64_t blocks = 0;
    CHECK(pagellm_engine_set_kv_budget(e, 40 * 32768, &blocks) == PAGELLM_OK, "shrink: %s",
          pagellm_last_error());
    CHECK(blocks == 40, "%llu blocks after shrinking", (unsigned long long)blocks);
    char *json = NULL;
    CHECK(pagellm_engine_stats_json(e, &json) == PAGELLM_OK, "stats");
    CHECK(contains(json, "\"device_total\":40") && contains(json, "\"kv_pool_bytes\":1310720") &&
              contains(json, "\"losses\":0"),
          "%s", json);
    pagellm_string_free(json);
    greedy_matches(e, want, n_want);
    CHECK(pagellm_engine_set_kv_budget(e, 4 * 32768, &blocks) == PAGELLM_ERR_ARGUMENT, "4 blocks");
    CHECK(contains(pagellm_last_error(), "32"), "names the blocks needed: %s", pagellm_last_error());
    CHECK(pagellm_engine_set_kv_budget(e, 64 * 32768, NULL) == PAGELLM_OK, "grow");
    CHECK(pagellm_engine_set_kv_budget(NULL, 1, NULL) == PAGELLM_ERR_HANDLE, "null engine");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR EXPECTED_IDS...\n", argv[0]);
        return 2;
    }
    uint32_t want[64];
    size_t n_want = 0;
    for (int i = 2; i < argc && n_want < 64; i++) {
        want[n_want++] = (uint32_t)strtoul(argv[i], NULL, 10);
    }
    bad_inputs_before_loading(argv[1]);
    pagellm_config c = pagellm_config_default();
    c.model_path = argv[1];
    c.num_gpu_blocks = 64;
    pagellm_engine *e = NULL;
    if (pagellm_engine_new(&c, &e) != PAGELLM_OK) {
        fprintf(stderr, "loading %s: %s\n", argv[1], pagellm_last_error());
        return 1;
    }
    greedy_matches(e, want, n_want);
    sampled_and_json(e);
    abort_and_free_mid_stream(e);
    bad_requests(e);
    kv_budget(e, want, n_want);

    /* A request outliving its engine ends (aborted, or the engine's end), without harm. */
    pagellm_request *r = NULL;
    pagellm_sampling p = pagellm_sampling_default();
    p.max_tokens = 200;
    p.ignore_eos = 1;
    CHECK(pagellm_submit(e, "Once upon a time", &p, &r) == PAGELLM_OK, "submit");
    pagellm_engine_free(e);
    outcome o;
    drain(r, &o, 0);
    CHECK(o.status == PAGELLM_END || o.status == PAGELLM_ERR_ENGINE, "after the engine: %d",
          (int)o.status);
    pagellm_request_free(r);
    CHECK(pagellm_submit(e, "x", NULL, &r) == PAGELLM_ERR_HANDLE, "freed engine");
    pagellm_engine_free(e); /* twice: ignored */
    size_t engines = 1, requests = 1;
    CHECK(pagellm_handles_alive(&engines, &requests) == PAGELLM_OK, "handles alive");
    CHECK(engines == 0 && requests == 0, "%zu engines and %zu requests not freed", engines, requests);

    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
