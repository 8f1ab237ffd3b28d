// llama.cpp's mtmd (tools/mtmd) on one image, a test tool for the vision checks (built by build.sh):
//   mtmd-ref MODEL MMPROJ IMAGE PROMPT N_PREDICT N_THREADS OUT_PREFIX [N_ENCODE]
// PROMPT holds mtmd's default marker (<__media__>) where the image goes. Writes OUT_PREFIX.pix (the preprocessed
// image as the vision graph reads it: float32 [3][ny][nx], planar) and OUT_PREFIX.embd (float32 [n_tokens][n_embd],
// the projected image embeddings) and OUT_PREFIX.logits (the prompt's last logits), then prints one JSON line: the chunks' text tokens, the image's token count, the
// encode times (N_ENCODE encodes, default 1) and N_PREDICT greedy tokens after the prompt (mtmd_helper_eval_chunks:
// the image decoded non-causally where mtmd says so).
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"
#include "ggml.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static std::vector<float> g_pix;
static int g_pix_nx = 0, g_pix_ny = 0;

// the image input of the vision graph is src[1] of its patch convolution (im2col)
static bool grab_input(struct ggml_tensor * t, bool ask, void *) {
    if (ask) return t->op == GGML_OP_IM2COL;
    if (t->op == GGML_OP_IM2COL && g_pix.empty()) {
        const ggml_tensor * in = t->src[1];
        g_pix.resize(ggml_nelements(in));
        memcpy(g_pix.data(), in->data, g_pix.size() * sizeof(float));
        g_pix_nx = (int) in->ne[0];
        g_pix_ny = (int) in->ne[1];
    }
    return true;
}

int main(int argc, char ** argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s MODEL MMPROJ IMAGE PROMPT N_PREDICT N_THREADS OUT_PREFIX [N_ENCODE]\n", argv[0]);
        return 2;
    }
    const int n_predict = atoi(argv[5]), n_threads = atoi(argv[6]);
    const std::string out = argv[7];
    const int n_encode = argc > 8 ? atoi(argv[8]) : 1;
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    auto cp = llama_context_default_params();
    cp.n_ctx = 2048; cp.n_batch = 1024; cp.n_ubatch = 1024; cp.n_threads = n_threads; cp.n_threads_batch = n_threads;
    llama_context * lctx = llama_init_from_model(model, cp);
    auto mparams = mtmd_context_params_default();
    mparams.use_gpu = false;
    mparams.n_threads = n_threads;
    mparams.warmup = false;
    mparams.cb_eval = grab_input;
    mtmd_context * mctx = mtmd_init_from_file(argv[2], model, mparams);
    if (!mctx) { fprintf(stderr, "cannot load %s\n", argv[2]); return 1; }
    auto bw = mtmd_helper_bitmap_init_from_file(mctx, argv[3], false, mtmd_helper_init_opt_default());
    if (!bw.bitmap) { fprintf(stderr, "cannot read %s\n", argv[3]); return 1; }
    mtmd_input_text text = { argv[4], strlen(argv[4]), true, true };
    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    const mtmd_bitmap * bmps[1] = { bw.bitmap };
    if (mtmd_tokenize(mctx, chunks, &text, bmps, 1) != 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
    const int n_embd = llama_model_n_embd_inp(model);
    std::string js = "{\"chunks\": [";
    std::vector<double> ms;
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks, i);
        if (i) js += ", ";
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n = 0;
            const llama_token * toks = mtmd_input_chunk_get_tokens_text(c, &n);
            js += "[";
            for (size_t j = 0; j < n; j++) js += (j ? ", " : "") + std::to_string(toks[j]);
            js += "]";
        } else {
            const size_t n_tok = mtmd_input_chunk_get_n_tokens(c);
            for (int r = 0; r < n_encode; r++) {
                auto t0 = std::chrono::steady_clock::now();
                if (mtmd_encode_chunk(mctx, c) != 0) { fprintf(stderr, "encode failed\n"); return 1; }
                ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            }
            FILE * f = fopen((out + ".embd").c_str(), "wb");
            fwrite(mtmd_get_output_embd(mctx), sizeof(float), n_tok * n_embd, f);
            fclose(f);
            f = fopen((out + ".pix").c_str(), "wb");
            fwrite(g_pix.data(), sizeof(float), g_pix.size(), f);
            fclose(f);
            js += "{\"image_tokens\": " + std::to_string(n_tok) + ", \"nx\": " + std::to_string(g_pix_nx) +
                  ", \"ny\": " + std::to_string(g_pix_ny) + ", \"non_causal\": " +
                  (mtmd_decode_use_non_causal(mctx, c) ? "true" : "false") + "}";
        }
    }
    js += "], \"encode_ms\": [";
    for (size_t i = 0; i < ms.size(); i++) js += (i ? ", " : "") + std::to_string(ms[i]);
    js += "], \"generated\": [";
    if (n_predict > 0) {
        llama_pos n_past = 0;
        if (mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, cp.n_batch, true, &n_past) != 0) {
            fprintf(stderr, "eval failed\n"); return 1;
        }
        const llama_vocab * vocab = llama_model_get_vocab(model);
        const int n_vocab = llama_vocab_n_tokens(vocab);
        FILE * lf = fopen((out + ".logits").c_str(), "wb");   // the prompt's last logits
        fwrite(llama_get_logits_ith(lctx, -1), sizeof(float), n_vocab, lf);
        fclose(lf);
        for (int k = 0; k < n_predict; k++) {
            const float * lg = llama_get_logits_ith(lctx, -1);
            llama_token best = 0;
            for (int v = 1; v < n_vocab; v++) if (lg[v] > lg[best]) best = v;
            js += (k ? ", " : "") + std::to_string(best);
            llama_batch b = llama_batch_get_one(&best, 1);
            if (llama_decode(lctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        }
    }
    js += "]}";
    printf("%s\n", js.c_str());
    mtmd_input_chunks_free(chunks);
    mtmd_free(mctx);
    llama_free(lctx);
    llama_model_free(model);
    return 0;
}
