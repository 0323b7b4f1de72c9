//! Choosing the next token from logits: greedy, or sampled with
//! temperature, top-k, top-p and min-p after a repetition penalty, from a
//! seeded generator (same seed, same text). Banned tokens are never chosen.

/// Sampling settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1.0: all).
    pub top_p: f32,
    /// Drop tokens below `min_p ×` the top probability (0: none).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recent tokens by this (1.0: off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_last_n: usize,
    /// Seed of the generator.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

/// A seeded generator (splitmix64): portable and reproducible.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Picks the next token. `recent` are the latest tokens (for the penalty);
/// `banned[id]` tokens are never picked.
pub(crate) fn sample(
    logits: &mut [f32],
    s: &Sampling,
    recent: &[u32],
    banned: &[bool],
    rng: &mut Rng,
) -> u32 {
    for (i, l) in logits.iter_mut().enumerate() {
        if banned.get(i).copied().unwrap_or(false) {
            *l = f32::NEG_INFINITY;
        }
    }
    if s.repeat_penalty != 1.0 && s.repeat_penalty > 0.0 {
        let from = recent.len().saturating_sub(s.repeat_last_n);
        let mut seen = std::collections::HashSet::new();
        for &t in &recent[from..] {
            if seen.insert(t) {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / s.repeat_penalty } else { *l * s.repeat_penalty };
                }
            }
        }
    }
    if s.temperature <= 0.0 {
        return argmax(logits);
    }
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l / s.temperature))
        .collect();
    if cand.is_empty() {
        return argmax(logits);
    }
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if s.top_k > 0 && cand.len() > s.top_k {
        cand.truncate(s.top_k);
    }
    let max = cand[0].1;
    let mut probs: Vec<f64> = cand.iter().map(|(_, l)| ((l - max) as f64).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    let mut keep = probs.len();
    if s.min_p > 0.0 {
        let floor = probs[0] * s.min_p as f64;
        keep = probs.iter().take_while(|&&p| p >= floor).count().max(1);
    }
    if s.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, p) in probs[..keep].iter().enumerate() {
            acc += p;
            if acc >= s.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    let total: f64 = probs[..keep].iter().sum();
    let mut r = rng.unit() * total;
    for (i, p) in probs[..keep].iter().enumerate() {
        if r < *p {
            return cand[i].0;
        }
        r -= p;
    }
    cand[keep - 1].0
}

/// Index of the largest logit (the first on ties, as llama.cpp).
pub(crate) fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut bv = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l > bv {
            bv = l;
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_max_and_respects_bans() {
        let mut l = vec![0.1, 3.0, 2.0];
        assert_eq!(sample(&mut l.clone(), &Sampling::default(), &[], &[], &mut Rng::new(1)), 1);
        assert_eq!(sample(&mut l, &Sampling::default(), &[], &[false, true], &mut Rng::new(1)), 2);
    }

    #[test]
    fn same_seed_same_choice() {
        let s =
            Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..Sampling::default() };
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let pick = |seed| {
            let mut rng = Rng::new(seed);
            (0..20).map(|_| sample(&mut logits.clone(), &s, &[], &[], &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(pick(7), pick(7));
        assert_ne!(pick(7), pick(8));
    }
}
