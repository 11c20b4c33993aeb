//! The scheduler and block manager on the CPU, case by case: requests that can never fit
//! fail alone in every preemption mode; forks never exceed `max_num_seqs`; a group's
//! sequences are never split by the token budget; running decodes go before prefill
//! chunks; automatic preemption follows the measured costs; a commit whose samples do not
//! fit their group fails that group alone, and forks share blocks until they finish. Every
//! driver run also passes the driver's per-step checks (`common/sched_driver.rs`) and ends
//! with nothing leaked.

#[path = "common/sched_driver.rs"]
mod driver;

use driver::{Driver, Outcome, Req};
use pagellm::internals::cache::{BlockManager, CacheConfig};
use pagellm::internals::engine::scheduler::{
    choose_mode, BeamChild, Fork, NextToken, PreemptionCosts, SampleOutcome, Sampled, Scheduler,
    SchedulerOutput, Victim,
};
use pagellm::internals::engine::sequence::{GroupShape, Sequence, SequenceGroup};
use pagellm::internals::engine::{EngineConfig, FinishReason, PreemptionMode};

const MODES: [Option<PreemptionMode>; 3] = [
    Some(PreemptionMode::Swap),
    Some(PreemptionMode::Recompute),
    None,
];

fn driver(
    blocks: usize,
    block_size: usize,
    host: usize,
    mode: Option<PreemptionMode>,
    edit: impl FnOnce(&mut EngineConfig),
) -> Driver {
    let mut cfg = EngineConfig {
        block_size,
        preemption_mode: mode,
        max_num_seqs: 16,
        max_num_batched_tokens: 64,
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    edit(&mut cfg);
    let cache = CacheConfig::new(block_size, blocks, host)
        .with_watermark_blocks(0)
        .with_prefix_caching(cfg.enable_prefix_caching);
    Driver::new(cfg, cache)
}

fn req(prompt_len: usize, shape: GroupShape, max_tokens: usize, seed: u64) -> Req {
    Req {
        prompt: (0..prompt_len as u32)
            .map(|t| 100 + t * 7 + seed as u32)
            .collect(),
        shape,
        max_tokens,
        seed,
        ignore_eos: true,
    }
}

/// The request's outcome when it runs alone on an ample pool.
fn alone(r: &Req) -> Outcome {
    let mut d = driver(4096, 4, 0, None, |c| c.max_num_seqs = 64);
    d.add(0, r.clone());
    d.run(100_000).unwrap();
    d.outcomes[&0].clone()
}

fn failure(o: &Outcome) -> &str {
    match o {
        Outcome::Failed(m) => m,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn a_group_that_can_never_fit_fails_alone_in_every_mode() {
    // 12 blocks of 4 tokens. Four samples of 44 tokens need at least 4 * 10 blocks minus
    // the shared prompt block: never. The other requests fit easily.
    let big = req(4, GroupShape::Samples(4), 40, 1);
    let small = [
        req(3, GroupShape::Samples(1), 10, 2),
        req(6, GroupShape::Samples(2), 5, 3),
    ];
    for mode in MODES {
        let mut d = driver(12, 4, 100, mode, |_| {});
        d.add(0, big.clone());
        d.add(1, small[0].clone());
        d.add(2, small[1].clone());
        d.run(2_000).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        let msg = failure(&d.outcomes[&0]);
        assert!(
            msg.contains("KV blocks together") && msg.contains("--num-gpu-blocks"),
            "{mode:?}: {msg}"
        );
        for (i, r) in small.iter().enumerate() {
            assert_eq!(
                d.outcomes[&(i as u64 + 1)],
                alone(r),
                "{mode:?}: request {}",
                i + 1
            );
        }
        assert!(
            d.sched.stats.preemptions < 20,
            "{mode:?}: {} preemptions",
            d.sched.stats.preemptions
        );
        d.check_drained().unwrap();
    }
}

#[test]
fn a_prompt_longer_than_the_pool_fails_at_admission() {
    let mut d = driver(8, 4, 10, None, |_| {});
    d.add(0, req(40, GroupShape::Samples(1), 2, 1));
    d.add(1, req(5, GroupShape::Samples(1), 3, 2));
    d.run(100).unwrap();
    let msg = failure(&d.outcomes[&0]);
    assert!(
        msg.contains("need 11 KV blocks together at 40 tokens"),
        "{msg}"
    );
    assert!(matches!(d.outcomes[&1], Outcome::Finished(_)));
    d.check_drained().unwrap();
}

#[test]
fn recomputed_groups_are_admitted_jointly_or_fail_alone() {
    // Recompute mode: a preempted 3-sample group comes back as three separate prompts.
    // 20 blocks of 2 tokens; the group's samples share a 4-token prompt and each grows to
    // 12 tokens: 2 + 3 * 4 = 14 blocks shared, 3 * 6 = 18 unshared; both fit. An older
    // request forces the preemption.
    let old = req(10, GroupShape::Samples(1), 14, 7);
    let group = req(4, GroupShape::Samples(3), 8, 8);
    let mut d = driver(20, 2, 0, Some(PreemptionMode::Recompute), |_| {});
    d.add(0, old.clone());
    d.add(1, group.clone());
    d.run(1_000).unwrap();
    assert!(
        d.sched.stats.preempted_by_recompute > 0,
        "{:?}",
        d.sched.stats
    );
    assert_eq!(d.outcomes[&0], alone(&old));
    assert_eq!(d.outcomes[&1], alone(&group));
    d.check_drained().unwrap();

    // Now the group would not fit recomputed (3 * 8 = 24 > 20 blocks unshared) and has no
    // host pool to swap to, so the older request is preempted in its place: the group fits
    // while it shares (2 + 3 * 6 = 20 blocks), and both finish.
    let group = req(4, GroupShape::Samples(3), 12, 8);
    let mut d = driver(20, 2, 0, Some(PreemptionMode::Recompute), |_| {});
    d.add(0, old.clone());
    d.add(1, group.clone());
    d.run(1_000).unwrap();
    assert_eq!(d.outcomes[&0], alone(&old));
    assert_eq!(d.outcomes[&1], alone(&group));
    assert!(d.sched.stats.preempted_by_recompute > 0);
    d.check_drained().unwrap();

    // Where a group outgrows even its shared footprint (4 samples: 2 + 4 * 6 = 26 > 20), it
    // fails alone with the reason, and the older request finishes as it would alone.
    let group = req(4, GroupShape::Samples(4), 12, 8);
    let mut d = driver(20, 2, 0, Some(PreemptionMode::Recompute), |_| {});
    d.add(0, old.clone());
    d.add(1, group);
    d.run(1_000).unwrap();
    assert_eq!(d.outcomes[&0], alone(&old));
    assert!(failure(&d.outcomes[&1]).contains("KV blocks together"));
    d.check_drained().unwrap();
}

#[test]
fn forks_never_exceed_max_num_seqs() {
    let reqs: Vec<Req> = (0..3)
        .map(|i| req(5, GroupShape::Samples(3), 6, 10 + i))
        .collect();
    let mut d = driver(200, 4, 0, None, |c| c.max_num_seqs = 4);
    for (i, r) in reqs.iter().enumerate() {
        d.add(i as u64, r.clone());
    }
    d.add(3, req(5, GroupShape::Samples(5), 6, 20));
    d.add(4, req(5, GroupShape::Beams(5), 6, 21));
    // The driver checks every step that live sequences and reserved slots stay within 4.
    d.run(1_000).unwrap();
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(d.outcomes[&(i as u64)], alone(r));
    }
    for id in [3, 4] {
        let msg = failure(&d.outcomes[&id]);
        assert!(
            msg.contains("needs 5 sequences at once but max_num_seqs is 4"),
            "{msg}"
        );
    }
    assert!(d.sched.stats.peak_running_seqs <= 4);
    d.check_drained().unwrap();
}

#[test]
fn beams_are_never_split_by_the_token_budget() {
    // Budget 6: two 4-beam groups cannot decode in the same step; a long prompt competes.
    let reqs = [
        req(3, GroupShape::Beams(4), 8, 30),
        req(3, GroupShape::Beams(4), 8, 31),
        req(50, GroupShape::Samples(1), 4, 32),
        req(2, GroupShape::Samples(3), 5, 33),
    ];
    let mut d = driver(200, 4, 50, None, |c| c.max_num_batched_tokens = 6);
    for (i, r) in reqs.iter().enumerate() {
        d.add(i as u64, r.clone());
    }
    d.add(9, req(3, GroupShape::Beams(7), 8, 34));
    d.run(2_000).unwrap();
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(d.outcomes[&(i as u64)], alone(r), "request {i}");
    }
    let msg = failure(&d.outcomes[&9]);
    assert!(
        msg.contains("take 7 tokens per step but a step holds 6"),
        "{msg}"
    );
    d.check_drained().unwrap();
}

/// Request 1 (short prompt) arrives later than request 0 (a long prompt) but is admitted
/// first; then request 1 decodes while the older request 0 prefills in chunks.
fn decode_vs_prefill(decode_first: bool) -> (u64, u64) {
    let mut d = driver(400, 4, 0, None, |c| {
        c.max_num_batched_tokens = 16;
        c.decode_first = decode_first;
    });
    d.add(1, req(4, GroupShape::Samples(1), 8, 41));
    d.add(0, req(400, GroupShape::Samples(1), 2, 40));
    let mut done = [0u64; 2];
    while !d.is_idle() {
        d.step().unwrap();
        for (id, slot) in done.iter_mut().enumerate() {
            if *slot == 0 && d.outcomes.contains_key(&(id as u64)) {
                *slot = d.steps;
            }
        }
    }
    d.check_drained().unwrap();
    (done[1], done[0])
}

#[test]
fn running_decodes_go_before_prefill_chunks() {
    // Decode first: the short request takes its 8 tokens in 8 steps while the long prompt
    // (25 chunks of 16) is prefilled beside it.
    let (short, long) = decode_vs_prefill(true);
    assert!(short <= 9, "the short request finished at step {short}");
    assert!(long >= 26);
    // Oldest first, the long prompt takes every step's budget and the decode waits for it.
    let (short_old, _) = decode_vs_prefill(false);
    assert!(
        short_old > 25,
        "oldest first finished the short one at {short_old}"
    );
}

fn victim(blocks: usize, tokens: usize, seqs: usize) -> Victim {
    Victim {
        blocks,
        tokens,
        seqs,
        host_has_room: true,
        recompute_fits: true,
    }
}

#[test]
fn the_preemption_mode_follows_the_measured_costs() {
    use PreemptionMode::{Recompute, Swap};
    let mut costs = PreemptionCosts::new(1 << 20); // 1 MiB blocks
                                                   // Nothing measured yet: groups swap, single sequences recompute.
    assert_eq!(
        choose_mode(None, &costs, &victim(4, 64, 1)),
        (Recompute, None)
    );
    assert_eq!(choose_mode(None, &costs, &victim(4, 64, 2)), (Swap, None));
    // 1 GiB/s both ways; 1,000 tokens/s of prefill.
    costs.record_swap(1 << 30, 1.0);
    costs.record_prefill(1000, 1.0);
    // 4 blocks out and back: 8 MiB, ~7.8 ms; 64 tokens: 64 ms. Swap.
    let (mode, est) = choose_mode(None, &costs, &victim(4, 64, 1));
    let est = est.unwrap();
    assert_eq!(mode, Swap);
    assert!((est.swap_s - 8.0 / 1024.0).abs() < 1e-9 && (est.recompute_s - 0.064).abs() < 1e-9);
    // 100 blocks for 5 tokens (think huge KV per token): recompute.
    assert_eq!(choose_mode(None, &costs, &victim(100, 5, 1)).0, Recompute);
    // Explicit modes override the estimate; a full host pool always recomputes; a group
    // that would not fit unshared swaps.
    assert_eq!(
        choose_mode(Some(Recompute), &costs, &victim(4, 64, 1)).0,
        Recompute
    );
    assert_eq!(choose_mode(Some(Swap), &costs, &victim(100, 5, 1)).0, Swap);
    let full = Victim {
        host_has_room: false,
        ..victim(4, 64, 2)
    };
    assert_eq!(choose_mode(Some(Swap), &costs, &full).0, Recompute);
    let unshared = Victim {
        recompute_fits: false,
        ..victim(100, 5, 3)
    };
    assert_eq!(choose_mode(None, &costs, &unshared).0, Swap);
    // The averages follow new measurements.
    costs.record_prefill(100_000, 1.0);
    assert!(costs.prefill_tokens_per_s.unwrap() > 1000.0);
}

/// A preemption-heavy workload of single sequences under injected costs.
fn pressured(costs: PreemptionCosts) -> Driver {
    let mut d = driver(24, 4, 200, None, |_| {});
    d.sched.costs = costs;
    for i in 0..12 {
        d.add(i, req(5 + i as usize, GroupShape::Samples(1), 30, 50 + i));
    }
    d.run(5_000).unwrap();
    d.check_drained().unwrap();
    d
}

/// Injected measurements: blocks of `block_bytes`, swapping at `swap_bps` bytes/s,
/// prefill at `tps` tokens/s.
fn costs(block_bytes: u64, swap_bps: u64, tps: usize) -> PreemptionCosts {
    let mut c = PreemptionCosts::new(block_bytes);
    c.record_swap(swap_bps, 1.0);
    c.record_prefill(tps, 1.0);
    c
}

#[test]
fn automatic_preemption_swaps_or_recomputes_by_injected_cost() {
    let d = pressured(costs(4096, 1 << 30, 100));
    let s = d.sched.stats;
    assert!(s.preemptions > 0 && s.preempted_by_recompute == 0, "{s:?}");
    assert_eq!(s.chosen_by_cost, s.preemptions);
    let est = s.last_estimate.unwrap();
    assert!(est.swap_s < est.recompute_s);

    let d2 = pressured(costs(1 << 30, 1 << 20, 1_000_000));
    let s = d2.sched.stats;
    assert!(s.preemptions > 0 && s.preempted_by_swap == 0, "{s:?}");
    // Either way every request produced what it produces alone.
    assert_eq!(d.outcomes, d2.outcomes);
    for (id, out) in &d.outcomes {
        let r = req(5 + *id as usize, GroupShape::Samples(1), 30, 50 + id);
        assert_eq!(*out, alone(&r));
    }
}

/// A bare scheduler (no driver) with two single-prompt requests prefilled in one step: 0 of
/// `shape_0`, 1 a single sample. Returns the scheduler and that step's plan.
fn two_prefilled(shape_0: GroupShape) -> (Scheduler, SchedulerOutput) {
    let cfg = EngineConfig {
        block_size: 4,
        max_num_seqs: 16,
        max_num_batched_tokens: 64,
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let blocks = BlockManager::new(CacheConfig::new(4, 32, 8).with_watermark_blocks(0)).unwrap();
    let mut s = Scheduler::new(cfg, blocks);
    for (id, shape) in [(0, shape_0), (1, GroupShape::Samples(1))] {
        let first = Sequence::new(s.new_seq_id(), 0, &[5, 6, 7, 8, 9, 10], ());
        s.add(SequenceGroup::new(id, shape, 20, first, ()));
    }
    let out = s.schedule().unwrap();
    assert_eq!(out.scheduled.len(), 2, "{out:?}");
    (s, out)
}

fn tokens(seq: usize, token: u32) -> SampleOutcome<()> {
    SampleOutcome::Tokens {
        tokens: vec![NextToken {
            seq,
            accepted: 0,
            token,
            finish: None,
        }],
        forks: Vec::new(),
    }
}

#[test]
fn a_commit_that_does_not_fit_its_group_fails_that_group_alone() {
    let fork = |index| Fork {
        index,
        token: 3,
        finish: None,
        data: (),
    };
    let cases: Vec<(GroupShape, SampleOutcome<()>, &str)> = vec![
        (GroupShape::Samples(1), tokens(4, 1), "does not have live"),
        (
            GroupShape::Samples(3),
            SampleOutcome::Tokens {
                tokens: vec![],
                forks: vec![fork(1), fork(2)],
            },
            "exactly one sampled sequence",
        ),
        (
            GroupShape::Beams(2),
            SampleOutcome::Beams {
                children: vec![BeamChild {
                    parent: 3,
                    token: 1,
                    data: (),
                }],
                done: false,
            },
            "parent is not one of the group's sequences",
        ),
        (
            GroupShape::Samples(1),
            SampleOutcome::Failed("sampling broke".into()),
            "sampling broke",
        ),
    ];
    for (shape, bad, want) in cases {
        let (mut s, out) = two_prefilled(shape);
        let sampled = vec![
            Sampled {
                request_id: 0,
                outcome: bad,
            },
            Sampled {
                request_id: 1,
                outcome: tokens(0, 42),
            },
        ];
        let done = s.commit(&out, sampled).unwrap();
        assert!(done.finished.is_empty());
        let [f] = done.failed.as_slice() else {
            panic!("{shape:?}: {} failed", done.failed.len());
        };
        assert_eq!(f.group.request_id, 0);
        assert!(f.reason.contains(want), "{shape:?}: {}", f.reason);
        // The failed group is gone with its blocks; the other one took its token.
        assert_eq!(s.queue_of(0), None);
        assert!(f.group.seqs.iter().all(|q| !s.blocks().contains(q.id)));
        let other = s.get(1).unwrap();
        assert_eq!(other.seqs[0].tokens, [5, 6, 7, 8, 9, 10, 42]);
        assert_eq!(other.seqs[0].num_computed(s.blocks()), 6);
        assert_eq!(s.blocks().num_used_device_blocks(), 2);
        s.blocks().check_invariants().unwrap();
    }
}

#[test]
fn a_commit_forks_samples_and_frees_what_finishes() {
    let (mut s, out) = two_prefilled(GroupShape::Samples(3));
    let sampled = vec![Sampled {
        request_id: 0,
        outcome: SampleOutcome::Tokens {
            tokens: vec![NextToken {
                seq: 0,
                accepted: 0,
                token: 11,
                finish: None,
            }],
            forks: vec![
                Fork {
                    index: 1,
                    token: 12,
                    finish: Some(FinishReason::Stop),
                    data: (),
                },
                Fork {
                    index: 2,
                    token: 13,
                    finish: None,
                    data: (),
                },
            ],
        },
    }];
    let done = s.commit(&out, sampled).unwrap();
    assert!(done.finished.is_empty() && done.failed.is_empty());
    let g = s.get(0).unwrap();
    let got: Vec<(usize, Vec<u32>, bool)> = g
        .seqs
        .iter()
        .map(|q| (q.index, q.output_ids().to_vec(), s.blocks().contains(q.id)))
        .collect();
    // The finished fork holds no blocks; the live ones share the prompt's two blocks.
    assert_eq!(
        got,
        [
            (0, vec![11], true),
            (1, vec![12], false),
            (2, vec![13], true)
        ]
    );
    assert!(g.forked);
    assert_eq!(g.slots(), 2);
    let live = g.live_ids();
    let table = s.blocks().block_table(live[0]).unwrap().to_vec();
    assert_eq!(s.blocks().block_table(live[1]).unwrap(), &table[..]);
    assert_eq!(s.blocks().device_refcount(table[1]), Some(2));
    s.blocks().check_invariants().unwrap();
    // Both live samples finish next step: the group leaves the scheduler, blocks freed.
    let out = s.schedule().unwrap();
    let rows: Vec<NextToken> = out
        .scheduled
        .iter()
        .filter(|x| x.request_id == 0)
        .map(|x| NextToken {
            seq: x.seq,
            accepted: 0,
            token: 1,
            finish: Some(FinishReason::Length),
        })
        .collect();
    assert_eq!(rows.len(), 2);
    let done = s
        .commit(
            &out,
            vec![Sampled {
                request_id: 0,
                outcome: SampleOutcome::Tokens {
                    tokens: rows,
                    forks: Vec::new(),
                },
            }],
        )
        .unwrap();
    assert_eq!(done.finished.len(), 1);
    assert_eq!(s.queue_of(0), None);
    assert_eq!(s.num_groups(), 1);
    // Only request 1's prompt and the slot it took this step remain.
    assert_eq!(s.blocks().sequences().count(), 1);
    s.blocks().check_invariants().unwrap();
}

#[test]
fn a_prompt_takes_blocks_chunk_by_chunk() {
    // A 100-token prompt (25 blocks of 4) in chunks of 8 tokens: two blocks a step, never
    // the whole prompt at admission.
    let mut d = driver(40, 4, 0, None, |c| c.max_num_batched_tokens = 8);
    d.add(0, req(100, GroupShape::Samples(1), 3, 1));
    for step in 1..=12 {
        d.step().unwrap();
        assert_eq!(
            d.sched.blocks().num_used_device_blocks(),
            2 * step,
            "step {step}"
        );
    }
    while !d.is_idle() {
        d.step().unwrap();
    }
    d.check_drained().unwrap();
    assert!(matches!(d.outcomes[&0], Outcome::Finished(_)));
}

#[test]
fn partly_computed_prompts_never_hold_the_pool_so_that_none_finishes() {
    // Three 120-token prompts (30 blocks each) in a 40-block pool, 8 tokens a step: each is
    // admitted with its first chunk, and as the oldest grows it preempts the newer ones,
    // in every mode; all finish with what they produce alone.
    for mode in MODES {
        let mut d = driver(40, 4, 64, mode, |c| c.max_num_batched_tokens = 8);
        for id in 0..3 {
            d.add(id, req(120, GroupShape::Samples(1), 4, id));
        }
        d.step().unwrap();
        assert_eq!(
            d.sched.num_running(),
            1,
            "{mode:?}: the first chunk takes the step's budget"
        );
        let mut steps = 0;
        while !d.is_idle() {
            d.step().unwrap();
            steps += 1;
            assert!(steps < 2000, "{mode:?}: no progress");
        }
        d.check_drained().unwrap();
        for id in 0..3 {
            let want = alone(&req(120, GroupShape::Samples(1), 4, id));
            assert_eq!(d.outcomes[&id], want, "{mode:?}: request {id}");
        }
    }
}
