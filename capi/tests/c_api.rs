//! The C API from C, on the GPU (the default adapter): the C test suite
//! (`tests/c/test_capi.c`) built with AddressSanitizer, LeakSanitizer and UBSan and run on
//! the shipped model passes every check with no leak or invalid access; and the C and C++
//! examples (`examples/c/`) stream the greedy tokens transformers computed for the model,
//! which are also what `pagellm generate --json` prints. All are compiled with the system's
//! `cc`/`c++` against the committed header and the library cargo built.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The folder cargo put the library in (this test runs from its `deps/`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// No adapter at all: the GPU tests skip (CI always has lavapipe).
fn skip() -> bool {
    if pagellm::enumerate_adapters(pagellm::wgpu::Backends::all()).is_empty() {
        eprintln!("\n*** SKIPPED: no GPU adapter (install mesa-vulkan-drivers) ***\n");
        return true;
    }
    false
}

/// The shipped model's first reference case: prompt, transformers' greedy ids and text.
fn reference() -> (String, Vec<u32>, String) {
    let path = repo().join("models/fortunes-llama/expected.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let case = &v["cases"][0];
    let ids = case["greedy_ids"].as_array().unwrap();
    (
        case["prompt"].as_str().unwrap().to_string(),
        ids.iter().map(|x| x.as_u64().unwrap() as u32).collect(),
        case["greedy_text"].as_str().unwrap().to_string(),
    )
}

/// The folder of the shared library this `cargo test` built: `deps/`, beside this test
/// (cargo copies it up a folder only for `cargo build`).
fn lib_dir() -> PathBuf {
    target_dir().join("deps")
}

/// Compiles `source` (C, or C++ for a `.cpp`) against the header and the shared library;
/// returns the program.
fn compile(source: &Path, name: &str, sanitize: bool) -> PathBuf {
    let lib = lib_dir();
    assert!(
        lib.join("libpagellm_capi.so").exists(),
        "no libpagellm_capi.so in {}",
        lib.display()
    );
    let out = std::env::temp_dir().join(format!("pagellm-{name}-{}", std::process::id()));
    let cpp = source.extension().is_some_and(|e| e == "cpp");
    let (var, compiler, std) = match cpp {
        true => ("CXX", "c++", "-std=c++17"),
        false => ("CC", "cc", "-std=c11"),
    };
    let mut cc = Command::new(std::env::var(var).unwrap_or_else(|_| compiler.into()));
    cc.args([std, "-Wall", "-Wextra", "-Werror", "-g"]);
    if sanitize {
        cc.args(["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]);
    }
    cc.arg(source)
        .arg("-I")
        .arg(repo().join("capi/include"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lpagellm_capi", "-lm", "-o"])
        .arg(&out);
    let status = cc.status().expect("running cc");
    assert!(status.success(), "cc failed on {}", source.display());
    out
}

/// Mesa's software drivers, `:`-separated, for LD_PRELOAD. The Vulkan loader and EGL unload
/// the driver when the instance goes, and LeakSanitizer, which looks at exit, then reports
/// what only the unloaded driver's globals pointed to as leaked from an unknown module (4 x
/// 128 bytes with Debian's Mesa 22.3.6-1+deb12u2: a report on the driver's unloading, not a
/// leak of ours). Preloaded, they stay mapped, and a leak of pagellm's (whose library is
/// never unloaded) is still reported.
fn mesa_drivers() -> String {
    let mut found = Vec::new();
    for lib in ["/usr/lib", "/usr/lib64"] {
        let Ok(dirs) = std::fs::read_dir(lib) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = dirs.flatten().map(|d| d.path()).collect();
        dirs.push(PathBuf::from(lib));
        for dir in dirs {
            for name in ["libvulkan_lvp.so", "dri/swrast_dri.so"] {
                let path = dir.join(name);
                if path.is_file() {
                    found.push(path.display().to_string());
                }
            }
        }
    }
    found.join(":")
}

#[test]
fn the_c_suite_passes_under_address_sanitizer() {
    if skip() {
        return;
    }
    let program = compile(&repo().join("capi/tests/c/test_capi.c"), "test-capi", true);
    let (_, ids, _) = reference();
    let out = Command::new(&program)
        .arg(repo().join("models/fortunes-llama"))
        .args(ids.iter().map(u32::to_string))
        .env_remove("LD_LIBRARY_PATH") // cargo's would find an older library first
        .env("ASAN_OPTIONS", "detect_leaks=1:verify_asan_link_order=0")
        .env("LD_PRELOAD", mesa_drivers())
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
        .output()
        .expect("running the C suite");
    let _ = std::fs::remove_file(&program);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "the C suite failed ({}):\n{stderr}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!stderr.contains("ERROR: AddressSanitizer"), "{stderr}");
    assert!(!stderr.contains("ERROR: LeakSanitizer"), "{stderr}");
}

#[test]
fn the_c_and_cpp_examples_stream_the_greedy_tokens_of_transformers_and_the_cli() {
    if skip() {
        return;
    }
    let (prompt, ids, text) = reference();
    let model = repo().join("models/fortunes-llama");
    for source in ["examples/c/generate.c", "examples/c/generate.cpp"] {
        let program = compile(&repo().join(source), "generate", false);
        let out = Command::new(&program)
            .arg(&model)
            .arg(&prompt)
            .arg(ids.len().to_string())
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .expect("running the example");
        let _ = std::fs::remove_file(&program);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{source}: {stderr}");
        let got = streamed_ids(&stderr);
        assert_eq!(got, ids, "{source}: not transformers' greedy tokens");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_end_matches('\n'),
            format!("{prompt}{text}"),
            "{source}"
        );
    }
    // The command line's JSON output, when the workspace's binary has been built (a
    // workspace `cargo test` builds it for the CLI's own tests).
    let cli = target_dir().join("pagellm");
    if !cli.exists() {
        eprintln!("no {} to compare with; skipped that part", cli.display());
        return;
    }
    let out = Command::new(cli)
        .arg("generate")
        .arg("--model")
        .arg(&model)
        .args([
            "--prompt",
            &prompt,
            "--temperature",
            "0",
            "--ignore-eos",
            "--json",
        ])
        .args(["--max-tokens", &ids.len().to_string()])
        .output()
        .expect("running the CLI");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let cli_ids: Vec<u32> = v["outputs"][0]["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no token_ids in {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, cli_ids, "the examples and the CLI differ");
}

/// The ids an example printed on standard error.
fn streamed_ids(stderr: &str) -> Vec<u32> {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("token ids:"))
        .unwrap_or_else(|| panic!("no token ids in {stderr}"))
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}
