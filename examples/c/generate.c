/*
 * Streams a completion from a model with pagellm's C API.
 *
 *   cc generate.c -I capi/include -L target/release -lpagellm_capi -o generate
 *   ./generate models/fortunes-llama "The meaning of life is" 24
 *
 * Prints the prompt and the generated text as it streams, then the generated token ids
 * on standard error. Greedy (temperature 0), so the tokens are the model's arg-max.
 */
#include <stdio.h>
#include <stdlib.h>

#include "pagellm.h"

static int check(pagellm_status s, const char *what) {
    if (s < 0) {
        fprintf(stderr, "%s: %s\n", what, pagellm_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL PROMPT [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    pagellm_config config = pagellm_config_default();
    config.model_path = argv[1];
    pagellm_engine *engine = NULL;
    if (check(pagellm_engine_new(&config, &engine), "loading the model")) {
        return 1;
    }

    pagellm_sampling params = pagellm_sampling_default();
    params.temperature = 0.0f;
    params.max_tokens = argc > 3 ? (uint32_t)atoi(argv[3]) : 24;
    params.ignore_eos = 1;
    pagellm_request *request = NULL;
    if (check(pagellm_submit(engine, argv[2], &params, &request), "submitting")) {
        pagellm_engine_free(engine);
        return 1;
    }

    uint32_t ids[4096];
    size_t n = 0;
    pagellm_event event;
    pagellm_status s;
    printf("%s", argv[2]);
    while ((s = pagellm_request_next(request, -1, &event)) == PAGELLM_OK) {
        if (event.kind == PAGELLM_EVENT_TOKEN) {
            fwrite(event.text, 1, event.text_len, stdout);
            fflush(stdout);
            if (n < sizeof ids / sizeof ids[0]) {
                ids[n++] = event.token_id;
            }
        }
    }
    printf("\n");
    int failed = check(s, "generating");
    fprintf(stderr, "token ids:");
    for (size_t i = 0; i < n; i++) {
        fprintf(stderr, " %u", ids[i]);
    }
    fprintf(stderr, "\n");

    pagellm_request_free(request);
    pagellm_engine_free(engine);
    return failed;
}
