//! The committed C header is what cbindgen generates from the crate now, so a change to
//! the API cannot ship with a stale header. `PAGELLM_BLESS=1 cargo test -p pagellm-capi
//! --test header` writes a fresh one.

use std::path::Path;

#[test]
fn the_committed_header_is_what_cbindgen_generates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_src(dir.join("src/lib.rs"))
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("UTF-8");
    let path = dir.join("include/pagellm.h");
    if std::env::var_os("PAGELLM_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("writing the header");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "{} is stale: regenerate it with `PAGELLM_BLESS=1 cargo test -p pagellm-capi --test \
         header` and commit it",
        path.display()
    );
}
