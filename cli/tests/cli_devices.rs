//! `pagellm devices`: lists adapters with the facts that matter, and turns bad adapter
//! settings into clear messages instead of panics.

use std::process::Command;

fn devices(env: &[(&str, &str)]) -> (bool, String, String) {
    devices_in(env, &[])
}

/// `pagellm devices` with `env` set and `remove` unset.
fn devices_in(env: &[(&str, &str)], remove: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pagellm"));
    cmd.arg("devices");
    for k in remove {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run pagellm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn lists_backend_type_driver_and_limits() {
    let (ok, stdout, stderr) = devices(&[]);
    if !ok && stderr.contains("no GPU adapter") {
        eprintln!("\n*** SKIPPED: no GPU adapter on any backend ***\n");
        return;
    }
    assert!(ok, "{stderr}");
    for field in [
        "backend:",
        "type:",
        "driver:",
        "max buffer size:",
        "max storage binding:",
        "memory:",
    ] {
        assert!(stdout.contains(field), "missing {field} in:\n{stdout}");
    }
    assert!(stdout.contains("(default choice)"), "{stdout}");
    // What the driver says of its free memory, or that it says nothing; an injected
    // report replaces it.
    let (ok, stdout, stderr) = devices(&[("PAGELLM_INJECT_DEVICE_MEMORY", "1073741824")]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("memory:             1024 MiB free of a 1024 MiB budget (injected)"),
        "{stdout}"
    );
}

#[test]
fn unknown_backend_is_a_clear_error() {
    let (ok, _, stderr) = devices(&[("PAGELLM_BACKEND", "vulcan")]);
    assert!(!ok);
    assert!(
        stderr.contains("unknown GPU backend \"vulcan\""),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn unmatched_adapter_name_is_reported_with_the_list() {
    let (ok, stdout, stderr) = devices(&[("WGPU_ADAPTER_NAME", "no-such-gpu-xyz")]);
    if !ok {
        // No adapter at all: still a message, not a panic.
        assert!(stderr.contains("no GPU adapter"), "{stderr}");
        return;
    }
    assert!(
        stderr.contains("no GPU adapter name contains \"no-such-gpu-xyz\""),
        "{stderr}"
    );
    assert!(!stdout.contains("(default choice)"), "{stdout}");
}

#[test]
fn a_machine_without_a_desktop_session_gets_no_stray_error_lines() {
    // No XDG_RUNTIME_DIR (a server, a container, SSH): adapter probing used to print the
    // Wayland client's complaint once per Vulkan instance.
    let (ok, stdout, stderr) = devices_in(&[], &["XDG_RUNTIME_DIR", "NODEVICE_SELECT"]);
    if !ok && stderr.contains("no GPU adapter") {
        eprintln!("\n*** SKIPPED: no GPU adapter on any backend ***\n");
        return;
    }
    assert!(ok, "{stderr}");
    assert!(stdout.contains("(default choice)"), "{stdout}");
    assert!(
        !stderr.to_lowercase().contains("error"),
        "stderr of a successful run:\n{stderr}"
    );
}
