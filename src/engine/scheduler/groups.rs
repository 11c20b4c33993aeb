//! What happens to a group's sequences between steps, kept next to the block manager that
//! must follow every change: parallel samples forked off the prompt, beams reshuffled,
//! finished sequences freed, whole groups forgotten.

use super::super::sequence::SequenceGroup;
use super::{Groups, Scheduler};
use crate::cache::{CacheError, SeqId};
use crate::engine::output::RequestId;

impl Scheduler {
    /// Forgets `id` and frees every block its sequences hold (finish, abort or failure).
    pub fn remove<D, R>(&mut self, id: RequestId, groups: &Groups<D, R>) {
        self.waiting.retain(|&g| g != id);
        self.running.retain(|&g| g != id);
        self.swapped.retain(|&g| g != id);
        if let Some(g) = groups.get(&id) {
            for s in &g.seqs {
                self.free_seq(s.id);
            }
        }
    }

    /// Frees a finished sequence's blocks (its group may continue).
    pub fn free_seq(&mut self, id: SeqId) {
        if self.blocks.contains(id) {
            let _ = self.blocks.free(id);
        }
    }

    /// Appends a copy of sequence `parent` (an index into `g.seqs`) under the id `child`,
    /// sharing all its blocks; returns the copy's index. The caller gives it its own
    /// sample index and sampler.
    pub fn fork_seq<D: Clone, R>(
        &mut self,
        g: &mut SequenceGroup<D, R>,
        parent: usize,
        child: SeqId,
    ) -> Result<usize, CacheError> {
        self.blocks.fork(g.seqs[parent].id, child)?;
        let mut s = g.seqs[parent].clone();
        s.id = child;
        g.seqs.push(s);
        g.forked = true;
        Ok(g.seqs.len() - 1)
    }

    /// One beam-search step's bookkeeping: the sequences `old` (indices into `g.seqs`, the
    /// live beams that sampled) are replaced by `children`, each `(parent, token)` with
    /// `parent` an index into `old`. A parent's first child continues it; later children
    /// fork its blocks; parents without children are freed. The new beams are ranked in
    /// the order of `children`.
    pub fn replace_beams<D: Clone, R>(
        &mut self,
        g: &mut SequenceGroup<D, R>,
        old: &[usize],
        children: &[(usize, u32)],
        mut new_id: impl FnMut() -> SeqId,
    ) -> Result<(), CacheError> {
        // The forks first, undone if one fails, so that an error leaves the group and the
        // block manager as they were.
        let mut used = vec![false; old.len()];
        let mut ids = Vec::with_capacity(children.len());
        for &(parent, _) in children {
            let parent_id = g.seqs[old[parent]].id;
            if std::mem::replace(&mut used[parent], true) {
                let child = new_id();
                if let Err(e) = self.blocks.fork(parent_id, child) {
                    ids.iter()
                        .filter(|&&c| c != parent_id)
                        .for_each(|&c| self.free_seq(c));
                    return Err(e);
                }
                ids.push(child);
            } else {
                ids.push(parent_id);
            }
        }
        let mut beams = Vec::with_capacity(children.len());
        for (&(parent, token), id) in children.iter().zip(ids) {
            let mut s = g.seqs[old[parent]].clone();
            s.id = id;
            s.tokens.push(token);
            s.index = beams.len();
            beams.push(s);
        }
        for (&i, used) in old.iter().zip(used) {
            if !used {
                self.free_seq(g.seqs[i].id);
            }
        }
        g.seqs = beams;
        Ok(())
    }
}
