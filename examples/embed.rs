//! Embedding pagellm in an application: load a model, stream a completion.
//! Run: `cargo run --example embed [MODEL_DIR]` (default: the shipped model).
use pagellm::{EngineConfig, EngineHandle, Event, Request, SamplingParams};
use std::io::Write;

fn main() -> Result<(), pagellm::Error> {
    let model = std::env::args().nth(1);
    let model = model.as_deref().unwrap_or("models/fortunes-llama");
    // The engine loads on a thread of its own; `load` returns once it takes requests.
    let engine = EngineHandle::load(model, EngineConfig::default())?;
    let params = SamplingParams {
        max_tokens: 24,
        temperature: 0.0,
        ..Default::default()
    };
    let request = Request::text("A wise man once said").with_params(params);
    // Events arrive as the engine steps; the loop ends after the last one.
    for event in engine.submit(request)? {
        match event {
            Event::Token { text, .. } => print!("{text}"),
            Event::Finished(_) => println!(),
            Event::Failed(why) => eprintln!("failed: {why}"),
        }
        std::io::stdout().flush().ok();
    }
    Ok(())
}
