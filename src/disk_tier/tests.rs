//! The disk tier against real files in a temporary folder: round trips, restarts, every
//! kind of damage, the byte budget, failing writes, and two "processes" sharing a folder.

use super::*;
use std::time::SystemTime;
use tempfile::TempDir;

const BLOCK: usize = 64;

fn open(dir: &Path, max_bytes: u64) -> DiskTier {
    let config = DiskTierConfig {
        dir: dir.to_path_buf(),
        store: None,
        max_bytes,
    };
    DiskTier::open(config, b"test model, f16, block 4", BLOCK).unwrap()
}

/// A payload that says which key it belongs to.
fn payload(key: BlockKey) -> Vec<u8> {
    (0..BLOCK).map(|i| key.0[i % 32] ^ i as u8).collect()
}

fn record_len(t: &DiskTier) -> u64 {
    let s = t.stats();
    s.bytes / s.records.max(1)
}

#[test]
fn a_stored_block_loads_back() {
    let tmp = TempDir::new().unwrap();
    let mut t = open(tmp.path(), 1 << 20);
    let k0 = t.key(None, &[1, 2, 3, 4]);
    let k1 = t.key(Some(k0), &[5, 6, 7, 8]);
    assert!(!t.contains(k1));
    assert!(t.store(k1, Some(k0), &[5, 6, 7, 8], &payload(k1)));
    assert!(t.contains(k1));
    assert!(
        !t.store(k1, Some(k0), &[5, 6, 7, 8], &payload(k1)),
        "stored twice"
    );
    let mut out = vec![0; BLOCK];
    assert!(t.load(k1, Some(k0), &[5, 6, 7, 8], &mut out));
    assert_eq!(out, payload(k1));
    let mut other = vec![0; BLOCK];
    assert!(!t.load(k0, None, &[1, 2, 3, 4], &mut other));
    let s = t.stats();
    assert_eq!(
        (s.writes, s.skipped, s.hits, s.misses, s.records),
        (1, 1, 1, 1, 1)
    );
}

#[test]
fn keys_name_the_whole_prefix_and_the_namespace() {
    let tmp = TempDir::new().unwrap();
    let t = open(tmp.path(), 1 << 20);
    let u = open(tmp.path(), 1 << 20);
    let k = t.key(None, &[1, 2]);
    assert_eq!(k, u.key(None, &[1, 2]), "a restart names blocks alike");
    assert_ne!(k, t.key(None, &[2, 1]));
    assert_ne!(k, t.key(None, &[1, 2, 0]));
    assert_ne!(
        t.key(Some(k), &[3]),
        t.key(Some(t.key(None, &[1, 3])), &[3])
    );
    assert_ne!(t.key(Some(k), &[3]), t.key(None, &[3]));
    let other = DiskTier::open(
        DiskTierConfig {
            dir: tmp.path().into(),
            store: None,
            max_bytes: 1 << 20,
        },
        b"another model",
        BLOCK,
    )
    .unwrap();
    assert_ne!(k, other.key(None, &[1, 2]));
    assert_ne!(t.dir(), other.dir());
    assert_eq!(BlockKey::from_hex(&k.to_hex()), Some(k));
}

#[test]
fn a_restart_finds_the_records() {
    let tmp = TempDir::new().unwrap();
    let k = {
        let mut t = open(tmp.path(), 1 << 20);
        let k = t.key(None, &[9, 9]);
        assert!(t.store(k, None, &[9, 9], &payload(k)));
        k
    };
    let mut t = open(tmp.path(), 1 << 20);
    assert_eq!(t.stats().records, 1);
    assert!(t.stats().bytes > BLOCK as u64);
    let mut out = vec![0; BLOCK];
    assert!(t.load(k, None, &[9, 9], &mut out));
    assert_eq!(out, payload(k));
}

#[test]
fn damaged_records_are_misses_and_are_deleted() {
    let tmp = TempDir::new().unwrap();
    let mut t = open(tmp.path(), 1 << 20);
    let tokens = [4, 5, 6, 7];
    let k = t.key(None, &tokens);
    t.store(k, None, &tokens, &payload(k));
    let path = t.path(k);
    let good = std::fs::read(&path).unwrap();
    let n = good.len();
    // Header, parent, tokens, payload and checksum bytes.
    let flips = [0, 9, 12, 50, 80, 110, 118, 125, 130, n - 40, n - 1];
    let mut corrupt = 0;
    for &at in &flips {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        std::fs::write(&path, &bad).unwrap();
        let mut out = vec![0xAA; BLOCK];
        assert!(
            !t.load(k, None, &tokens, &mut out),
            "a flip at byte {at} passed"
        );
        assert_eq!(out, vec![0xAA; BLOCK], "written from a bad record");
        assert!(!path.exists());
        corrupt += 1;
        assert_eq!(t.stats().corrupt, corrupt);
    }
    for cut in [0, 1, 20, n / 2, n - 33, n - 1] {
        std::fs::write(&path, &good[..cut]).unwrap();
        let mut out = vec![0xAA; BLOCK];
        assert!(!t.load(k, None, &tokens, &mut out), "cut at {cut} passed");
        assert_eq!(out, vec![0xAA; BLOCK]);
    }
    // Bytes after a whole record.
    std::fs::write(&path, [&good[..], &[0]].concat()).unwrap();
    assert!(!t.load(k, None, &tokens, &mut [0; BLOCK]));
    // Another key's whole record under this name.
    let k2 = t.key(None, &[4, 5, 6, 8]);
    t.store(k2, None, &[4, 5, 6, 8], &payload(k2));
    std::fs::copy(t.path(k2), &path).unwrap();
    assert!(!t.load(k, None, &tokens, &mut [0; BLOCK]));
    // A record cut short is written again by the next store; an intact one is not.
    std::fs::write(&path, &good[..n - 1]).unwrap();
    assert!(t.store(k, None, &tokens, &payload(k)));
    assert!(!t.store(k, None, &tokens, &payload(k)));
    // And the intact record still loads.
    std::fs::write(&path, &good).unwrap();
    assert!(t.load(k, None, &tokens, &mut [0; BLOCK]));
}

#[test]
fn a_record_must_match_what_the_reader_expects() {
    let tmp = TempDir::new().unwrap();
    let mut t = open(tmp.path(), 1 << 20);
    let p = t.key(None, &[1]);
    let k = t.key(Some(p), &[2, 3]);
    t.store(k, Some(p), &[2, 3], &payload(k));
    let good = std::fs::read(t.path(k)).unwrap();
    let mut out = vec![0; BLOCK];
    assert!(!t.load(k, Some(p), &[2, 4], &mut out), "other tokens");
    std::fs::write(t.path(k), &good).unwrap();
    assert!(!t.load(k, None, &[2, 3], &mut out), "no parent");
    std::fs::write(t.path(k), &good).unwrap();
    assert!(!t.load(k, Some(k), &[2, 3], &mut out), "another parent");
    std::fs::write(t.path(k), &good).unwrap();
    assert!(
        !t.load(k, Some(p), &[2, 3], &mut [0; 8]),
        "another block size"
    );
    std::fs::write(t.path(k), &good).unwrap();
    assert!(t.load(k, Some(p), &[2, 3], &mut out));
}

#[test]
fn the_budget_evicts_the_least_recently_used() {
    let tmp = TempDir::new().unwrap();
    let mut probe = open(tmp.path(), 1 << 20);
    let k = probe.key(None, &[0]);
    probe.store(k, None, &[0], &payload(k));
    let len = record_len(&probe);
    std::fs::remove_file(probe.path(k)).unwrap();

    let mut t = open(&tmp.path().join("b"), 3 * len);
    let keys: Vec<BlockKey> = (0..5).map(|i| t.key(None, &[i])).collect();
    for (i, &k) in keys.iter().enumerate().take(3) {
        assert!(t.store(k, None, &[i as u32], &payload(k)));
    }
    // A read makes the oldest the newest; the next two stores evict keys 1 and 2.
    assert!(t.load(keys[0], None, &[0], &mut [0; BLOCK]));
    for (i, &k) in keys.iter().enumerate().skip(3) {
        assert!(t.store(k, None, &[i as u32], &payload(k)));
    }
    let present: Vec<bool> = keys.iter().map(|&k| t.contains(k)).collect();
    assert_eq!(present, [true, false, false, true, true]);
    let s = t.stats();
    assert_eq!((s.evictions, s.records, s.bytes), (2, 3, 3 * len));
    // Nothing is written with no budget.
    let mut none = open(&tmp.path().join("c"), 0);
    assert!(!none.store(keys[0], None, &[0], &payload(keys[0])));
    assert_eq!(none.stats().write_errors, 0);
}

#[test]
fn failing_writes_are_counted_not_raised() {
    let tmp = TempDir::new().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let config = DiskTierConfig {
        dir: file.join("below"),
        store: None,
        max_bytes: 1 << 20,
    };
    assert!(DiskTier::open(config, b"ns", BLOCK).is_err());

    let mut t = open(tmp.path(), 1 << 20);
    let k = t.key(None, &[1]);
    // The record's subfolder is a file: creating the record fails, as root too.
    std::fs::write(t.dir().join(&k.to_hex()[..2]), b"in the way").unwrap();
    assert!(!t.store(k, None, &[1], &payload(k)));
    assert!(!t.store(k, None, &[1], &payload(k)[..8]));
    let s = t.stats();
    assert_eq!((s.write_errors, s.writes, s.records), (2, 0, 0));
    assert!(!t.load(k, None, &[1], &mut [0; BLOCK]));
}

#[test]
fn two_processes_share_a_folder() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().to_path_buf();
    let workers: Vec<_> = (0..2u32)
        .map(|w| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let mut t = open(&dir, 1 << 20);
                let mut hits = 0;
                for i in 0..200u32 {
                    // Half the keys are shared by both, half are this worker's own.
                    let tokens = [i % 20, if i % 2 == 0 { 99 } else { w }];
                    let k = t.key(None, &tokens);
                    if i % 3 == 0 {
                        t.store(k, None, &tokens, &payload(k));
                    } else {
                        let mut out = vec![0; BLOCK];
                        if t.load(k, None, &tokens, &mut out) {
                            assert_eq!(out, payload(k), "a wrong block was loaded");
                            hits += 1;
                        }
                    }
                }
                (hits, t.stats())
            })
        })
        .collect();
    for w in workers {
        let (hits, stats) = w.join().unwrap();
        assert!(hits > 0);
        assert_eq!(stats.corrupt, 0, "{stats:?}");
    }
}

#[test]
fn stale_temporary_files_are_cleaned_at_open() {
    let tmp = TempDir::new().unwrap();
    let t = open(tmp.path(), 1 << 20);
    let sub = t.dir().join("ab");
    std::fs::create_dir_all(&sub).unwrap();
    let old = sub.join(".ab00.1.1.tmp");
    let fresh = sub.join(".ab00.2.1.tmp");
    std::fs::write(&old, b"half a record").unwrap();
    std::fs::write(&fresh, b"being written").unwrap();
    let f = std::fs::File::options().append(true).open(&old).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    drop(f);
    let t = open(tmp.path(), 1 << 20);
    assert!(!old.exists() && fresh.exists());
    assert_eq!(t.stats().records, 0);
}
