//! The README shows the embedding example as it is: `examples/embed.rs` (which the crate's
//! documentation runs as a doc test and CI builds in a crate outside the repository) appears
//! in README.md verbatim, in a Rust code block.

#[test]
fn the_readme_holds_the_embedding_example_verbatim() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let example = std::fs::read_to_string(root.join("examples/embed.rs")).unwrap();
    let block = format!("```rust\n{example}```\n");
    assert!(
        readme.contains(&block),
        "README.md does not show examples/embed.rs as it is; paste it again"
    );
    // At most ~30 lines: what an application needs to stream a completion.
    assert!(example.lines().count() <= 30, "{}", example.lines().count());
}
