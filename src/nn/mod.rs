//! Plain definitions of the network's building blocks, shared by the model description
//! ([`crate::model`]), the GPU kernels ([`crate::kernels`]) and the plain-Rust oracle
//! ([`crate::reference`]), so that none of them reaches into another for them.

pub mod rope;

/// The gated MLP's activation: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `silu` (`hidden_act: "silu"`).
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
    /// gpt-oss's experts: with `g = min(gate, limit)` and `u = clamp(up, -limit, limit)`,
    /// `(u + 1) * g * sigmoid(alpha * g)` (`swiglu_alpha`, `swiglu_limit`).
    ClampedSwiglu { alpha: f32, limit: f32 },
}
