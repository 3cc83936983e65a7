//! Entry points for the fuzz targets (`fuzz/`): a request body through the same parsing and
//! validation the endpoints run, against a model described by numbers alone (no engine).

use axum::body::Bytes;
use strata_runtime::SamplingParams;

use crate::api::{self, Vocab};
use crate::chat_request::ChatRequest;
use crate::stream::json_body;

/// The vocabulary the fuzz targets check against: 1600 ids, 1554-1599 without a token.
const VOCAB: usize = 1600;
const TOKENIZER_VOCAB: u32 = 1554;
const CONTEXT: usize = 1024;

fn vocab_and_masked() -> (usize, Vec<u32>) {
    (VOCAB, (TOKENIZER_VOCAB..VOCAB as u32).collect())
}

/// A chat completion body, validated as `/v1/chat/completions` does before rendering: Ok, or
/// the error message a client would get. Never panics.
pub fn validate_chat(body: &[u8]) -> Result<(), String> {
    let (size, masked) = vocab_and_masked();
    let vocab = Vocab {
        size,
        masked: &masked,
    };
    let run = || -> api::ApiResult<()> {
        let obj = json_body(Ok(Bytes::copy_from_slice(body)))?;
        let r = ChatRequest::parse(&obj, SamplingParams::default(), &vocab)?;
        // The rendered prompt's length is the template's business; any length up to the context.
        let prompt = r.messages.len().min(CONTEXT);
        let budget = api::token_budget(r.common.max_tokens, prompt, CONTEXT)?;
        let top = r.logprobs.then_some(r.top.unwrap_or(0) as usize);
        api::check_logprob_size(r.common.stream, top, budget, r.common.n)
    };
    run().map_err(|e| e.message)
}

/// A text completion body (token-id prompts; text needs a tokenizer and is refused here),
/// validated as `/v1/completions` does.
pub fn validate_completion(body: &[u8]) -> Result<(), String> {
    let (size, masked) = vocab_and_masked();
    let vocab = Vocab {
        size,
        masked: &masked,
    };
    let run = || -> api::ApiResult<()> {
        let obj = json_body(Ok(Bytes::copy_from_slice(body)))?;
        let (logprobs, common) = crate::completions::fields(&obj, SamplingParams::default(), &vocab)?;
        let prompts = crate::completions::prompts(obj.get("prompt"), None)?;
        crate::completions::check_prompts(&prompts, common.n, size)?;
        for p in &prompts {
            let budget = api::token_budget(common.max_tokens, p.len(), CONTEXT)?;
            api::check_logprob_size(
                common.stream,
                logprobs.map(|k| k as usize),
                budget,
                prompts.len() * common.n,
            )?;
        }
        Ok(())
    };
    run().map_err(|e| e.message)
}
