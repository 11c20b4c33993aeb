//! Plain definitions of the network's building blocks, shared by the model description
//! ([`crate::model`]), the GPU kernels ([`crate::kernels`]) and the plain-Rust oracle
//! ([`crate::reference`]), so that none of them reaches into another for them.

pub mod rope;

/// The gated MLP's activation: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu` (`hidden_act: "silu"`).
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
}
