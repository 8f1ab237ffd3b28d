// never called by the driver: common.cpp's references to the parts of common it does not build
#include "common.h"
#include "sampling.h"
#include "speculative.h"
#include "fit.h"
#include "build-info.h"
#include <cstdlib>
int llama_build_number(void) { return 0; }
const char * llama_commit(void) { return "vendored"; }
const char * llama_compiler(void) { return "g++"; }
const char * llama_build_target(void) { return "driver"; }
common_params common_base_params_to_speculative(const common_params &) { abort(); }
struct common_sampler * common_sampler_init(const struct llama_model *, struct common_params_sampling &) { abort(); }
void common_sampler_free(struct common_sampler *) { abort(); }
struct llama_sampler * common_sampler_get(const struct common_sampler *) { abort(); }
std::vector<enum common_sampler_type> common_sampler_types_from_names(const std::vector<std::string> &) { abort(); }
common_params_fit_status common_fit_params(const char *, llama_model_params *, llama_context_params *, float *,
    llama_model_tensor_buft_override *, size_t *, uint32_t, const common_fit_extra_model *, ggml_log_level) { abort(); }
