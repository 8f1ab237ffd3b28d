"""The engine's rules for recurrent models (test_qwen35_engine.py's cases) on an lfm2 model, whose recurrent state is
the short convs' conv rows only: a cached prompt reused only whole, a context shift evaluating the kept tokens again,
speculative decoding and a recurrent draft model refused, slot states and the token loop, decode_parallel's shared
prompt. The same test functions, run here with the `model` fixture below."""
from __future__ import annotations

import pytest
from model_files import write_lfm2_model
from test_qwen35_engine import (  # noqa: F401  (collected here, on this module's model)
    test_context_shift_evaluates_the_kept_tokens_again, test_decode_parallel_shares_the_prompt_state,
    test_engine_runs_without_regions, test_prompt_reuse_only_of_the_whole_state, test_slot_state_round_trip,
    test_speculative_decoding_is_refused, test_token_loop_reuses_only_whole_states)

import powerinfer as pi


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("lfm2e") / "tiny-lfm2.gguf"
    write_lfm2_model(path, seed=5)
    return pi.Model(path)
