// Streams a completion with pagellm's C API from C++, the handles held by unique_ptr.
//
//   c++ -std=c++17 generate.cpp -I capi/include -L target/release -lpagellm_capi -o generate
//   ./generate models/fortunes-llama "The meaning of life is" 24
#include <cstdio>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "pagellm.h"

namespace {

struct EngineFree {
    void operator()(pagellm_engine *e) const { pagellm_engine_free(e); }
};
struct RequestFree {
    void operator()(pagellm_request *r) const { pagellm_request_free(r); }
};
using Engine = std::unique_ptr<pagellm_engine, EngineFree>;
using Request = std::unique_ptr<pagellm_request, RequestFree>;

void check(pagellm_status s, const char *what) {
    if (s < 0) {
        throw std::runtime_error(std::string(what) + ": " + pagellm_last_error());
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 3) {
        std::cerr << "usage: " << argv[0] << " MODEL PROMPT [MAX_TOKENS]\n";
        return 2;
    }
    try {
        pagellm_config config = pagellm_config_default();
        config.model_path = argv[1];
        pagellm_engine *raw_engine = nullptr;
        check(pagellm_engine_new(&config, &raw_engine), "loading the model");
        Engine engine(raw_engine);

        pagellm_sampling params = pagellm_sampling_default();
        params.temperature = 0.0f;
        params.max_tokens = argc > 3 ? static_cast<uint32_t>(std::stoul(argv[3])) : 24;
        params.ignore_eos = 1;
        pagellm_request *raw_request = nullptr;
        check(pagellm_submit(engine.get(), argv[2], &params, &raw_request), "submitting");
        Request request(raw_request);

        std::vector<uint32_t> ids;
        std::cout << argv[2] << std::flush;
        pagellm_event event;
        pagellm_status s;
        while ((s = pagellm_request_next(request.get(), -1, &event)) == PAGELLM_OK) {
            if (event.kind == PAGELLM_EVENT_TOKEN) {
                std::cout.write(event.text, static_cast<std::streamsize>(event.text_len));
                std::cout << std::flush;
                ids.push_back(event.token_id);
            }
        }
        std::cout << "\n";
        check(s, "generating");
        std::cerr << "token ids:";
        for (uint32_t id : ids) {
            std::cerr << " " << id;
        }
        std::cerr << "\n";
    } catch (const std::exception &e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
    return 0;
}
