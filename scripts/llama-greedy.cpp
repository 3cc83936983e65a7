// Greedy decoding with llama.cpp from token ids, for side-by-side runs with strata on the same
// GGUF file (docs/PERFORMANCE.md, "GGUF files side by side with llama.cpp"). Build against a
// static llama.cpp build (the source vendored in the llama-cpp-python sdist):
//   g++ -O2 -std=c++17 -I$L/include -I$L/ggml/include scripts/llama-greedy.cpp $L/build/src/libllama.a \
//       $L/build/ggml/src/libggml.a $L/build/ggml/src/libggml-cpu.a $L/build/ggml/src/libggml-base.a \
//       -lpthread -ldl -lm -fopenmp -o llama-greedy
// usage: llama-greedy MODEL.gguf N_NEW THREADS ID,ID,...   (prints the N_NEW generated ids)
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 5) { fprintf(stderr, "usage: greedy MODEL N THREADS IDS\n"); return 2; }
    int n_new = atoi(argv[2]), threads = atoi(argv[3]);
    std::vector<llama_token> ids;
    for (char * p = strtok(argv[4], ","); p; p = strtok(nullptr, ",")) ids.push_back(atoi(p));
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = ids.size() + n_new + 8;
    cp.n_batch = ids.size();
    cp.n_threads = cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_batch batch = llama_batch_get_one(ids.data(), ids.size());
    std::vector<llama_token> out;
    llama_token next;
    for (int i = 0; i < n_new; i++) {
        if (llama_decode(ctx, batch)) { fprintf(stderr, "decode failed\n"); return 1; }
        const float * logits = llama_get_logits_ith(ctx, -1);
        next = 0;
        for (int v = 1; v < n_vocab; v++) if (logits[v] > logits[next]) next = v;
        out.push_back(next);
        batch = llama_batch_get_one(&next, 1);
    }
    for (size_t i = 0; i < out.size(); i++) printf(i ? ",%d" : "%d", out[i]);
    printf("\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
