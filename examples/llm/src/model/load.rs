//! A model's weights, loaded from a GGUF file through a [`LinearFactory`]: immutable once
//! loaded, so one [`Model`] (behind an `Arc`) serves any number of sequences at once.

use std::sync::Arc;

use rknn_chip::LinearRole;
use rknn_matmul::engine::Engine;

use super::backend::{BackendError, LinearFactory, LinearOp};
use super::config::{Config, Moe, QkNorm};
use super::delta_net::{DeltaParams, DeltaState};
use super::error::ModelError;
use super::host_pool::HostPool;
use super::kv_cache::{CacheType, REWIND};
use crate::gguf::{GgmlType, GgufFile, SharedBytes, TensorView};

/// A weight matrix behind the seam, with its tensor name for error messages.
pub(super) struct Projection {
    pub(super) name: String,
    pub(super) op: Box<dyn LinearOp>,
}

impl Projection {
    /// The error of a failed forward.
    pub(super) fn failed(&self, source: BackendError) -> ModelError {
        ModelError::Backend {
            tensor: self.name.clone(),
            source,
        }
    }
}

/// One transformer block's weights.
pub(super) struct Layer {
    pub(super) attn_norm: Vec<f32>,
    /// Per-head RMSNorm weights of the queries and keys (`head_dim` each), if the family has
    /// them.
    pub(super) q_norm: Option<Vec<f32>>,
    pub(super) k_norm: Option<Vec<f32>>,
    /// RMSNorm weights of the attention's and the feed-forward's outputs, if the family has
    /// them.
    pub(super) attn_post_norm: Option<Vec<f32>>,
    pub(super) ffn_post_norm: Option<Vec<f32>>,
    /// q, k and v fused: they read the same input, so a backend that transforms its input
    /// (quantises, rotates) does it once, and runs one matmul instead of three. On a
    /// short-convolution layer, its `in_proj` (B, C and x).
    pub(super) wqkv: Projection,
    pub(super) bq: Option<Vec<f32>>,
    pub(super) bk: Option<Vec<f32>>,
    pub(super) bv: Option<Vec<f32>>,
    /// The attention's output projection; on a short-convolution layer, its `out_proj`.
    pub(super) wo: Projection,
    /// `attn_output.bias`, if the family allows it and the file has it
    /// ([`Family::optional_biases`](super::Family::optional_biases)).
    pub(super) bo: Option<Vec<f32>>,
    /// A dense feed-forward's `ffn_gate.bias`, `ffn_up.bias` (`n_ff` each) and `ffn_down.bias`
    /// (`n_embd`), each if the family allows it and the file has it.
    pub(super) b_gate: Option<Vec<f32>>,
    pub(super) b_up: Option<Vec<f32>>,
    pub(super) b_down: Option<Vec<f32>>,
    /// A short-convolution layer's kernel (`l_cache` taps per channel, channel after
    /// channel, as the file stores it); `None` on an attention layer.
    pub(super) conv: Option<Vec<f32>>,
    /// A gated delta-net layer's host weights; `None` on an attention layer. On such a layer
    /// `wqkv` is `attn_qkv`, `ssm_beta`, `ssm_alpha` and `attn_gate` fused, `wo` its `ssm_out`.
    pub(super) delta: Option<DeltaLayer>,
    pub(super) ffn_norm: Vec<f32>,
    pub(super) ffn: Ffn,
}

/// A gated delta-net layer's host weights.
pub(super) struct DeltaLayer {
    /// The convolution kernel, biases and decay rates, shared with the sequences' states.
    pub(super) params: Arc<DeltaParams>,
    /// `ssm_norm`, `head_dim` values: the gated RMSNorm of each value head's output.
    pub(super) norm: Vec<f32>,
}

/// A layer's feed-forward network.
pub(super) enum Ffn {
    /// One gated feed-forward for every row.
    Dense(Expert),
    /// A mixture of experts: each row runs the few its router chooses.
    Moe(Experts),
}

/// A gated feed-forward's two linears (a dense layer's, or one expert's).
pub(super) struct Expert {
    /// gate and up fused, for the same reason as q, k and v.
    pub(super) gate_up: Projection,
    pub(super) down: Projection,
}

/// A mixture-of-experts layer's weights: the router on the host, each expert's linears through
/// the factory like any other (an expert is whole resident linears).
pub(super) struct Experts {
    pub(super) moe: Moe,
    /// `ffn_gate_inp`, `n_expert` rows of `n_embd`, f32.
    pub(super) router: Vec<f32>,
    /// `exp_probs_b.bias`, `n_expert` values added to the probabilities to choose the
    /// experts (not to weight them), if the family has one ([`Moe::selection_bias`]).
    pub(super) bias: Option<Vec<f32>>,
    pub(super) experts: Vec<Expert>,
    /// The shared expert every row runs, unweighted (`ffn_{gate,up,down}_shexp`), if any.
    pub(super) shared: Option<Expert>,
}

/// A loaded model: its configuration and weights, and the host pool its passes run on.
/// Immutable (`Send + Sync`): each sequence keeps its own state in a
/// [`Sequence`](super::forward::Sequence), so many sequences, on many threads, share one
/// model.
pub struct Model {
    pub(super) config: Config,
    pub(super) embd_ty: GgmlType,
    pub(super) embd_row_bytes: usize,
    /// The token embedding's rows as the file stores them (quantised), kept in the file's
    /// mapping: read a row per token, never copied.
    pub(super) embd: SharedBytes,
    pub(super) layers: Vec<Layer>,
    pub(super) output_norm: Vec<f32>,
    pub(super) output: Projection,
    pub(super) rope_freqs: Option<Vec<f32>>,
    pub(super) pool: HostPool,
    /// The context size of its sequences.
    pub(super) n_ctx: usize,
    weight_format: &'static str,
    engine: Option<Engine>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field("weight_format", &self.weight_format)
            .finish_non_exhaustive()
    }
}

/// What a model holds in memory ([`Model::footprint`]), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// The weight matrices: the NPU memory the engine booked for them (with the A and C
    /// memories their contexts run with), or their f32 copies on the host path.
    pub weights: u64,
    /// The host tensors: the token embedding's quantised rows, norms, biases.
    pub host: u64,
    /// The KV cache of one sequence of the model's context size, full.
    pub kv: u64,
}

impl Footprint {
    /// Their sum.
    pub fn total(&self) -> u64 {
        self.weights + self.host + self.kv
    }
}

/// Loading progress: weight bytes converted so far and in total.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

impl Model {
    /// Builds the model from `file`, converting each weight matrix with `factory`; its host
    /// work (attention, the f32 path's matmuls) runs on `pool` (a [`HostPool`], or any rayon
    /// pool behind an `Arc`). `progress` is called after each tensor.
    ///
    /// [`Model::builder`] does all of loading in one place: the backend, the engine, the weight
    /// cache, the context, the tokenizer and the chat template.
    pub fn load(
        file: &GgufFile,
        factory: &mut dyn LinearFactory,
        pool: impl Into<HostPool>,
        progress: Progress<'_>,
    ) -> Result<Self, ModelError> {
        Model::load_config(
            file,
            Config::from_gguf(file)?,
            factory,
            pool.into(),
            progress,
        )
    }

    /// [`Model::load`] with `file`'s configuration already read.
    pub(crate) fn load_config(
        file: &GgufFile,
        c: Config,
        factory: &mut dyn LinearFactory,
        pool: HostPool,
        progress: Progress<'_>,
    ) -> Result<Self, ModelError> {
        let (e, q, kv, ff) = (
            c.n_embd as u64,
            c.q_dim() as u64,
            c.kv_dim() as u64,
            c.n_ff as u64,
        );
        let total: u64 = file.tensor_infos().iter().map(|t| t.n_bytes()).sum();
        let mut done = 0u64;

        let tensor = |name: &str, dims: &[u64]| -> Result<TensorView<'_>, ModelError> {
            let t = file
                .tensor(name)
                .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
            if t.dims() != dims || !t.ty().can_dequantize() {
                return Err(ModelError::BadTensor {
                    name: name.into(),
                    expected: dims.to_vec(),
                    found: t.dims().to_vec(),
                    ty: t.ty(),
                });
            }
            Ok(t)
        };
        let vector = |name: &str, len: u64, done: &mut u64| -> Result<Vec<f32>, ModelError> {
            let t = tensor(name, &[len])?;
            *done += t.data().len() as u64;
            Ok(t.to_f32()?)
        };
        // A linear of the weights `views` (each `[k, n_i]`), stacked along the outputs.
        // Expert `x` of a mixture: `expert` is `Some(x)`.
        let mut linear = |role: LinearRole,
                          views: &[TensorView<'_>],
                          done: &mut u64,
                          expert: Option<usize>|
         -> Result<Projection, ModelError> {
            let name = views.iter().map(|t| t.name()).collect::<Vec<_>>().join("+");
            let op = match expert {
                Some(x) => factory.build_expert(role, views, x),
                None => factory.build(role, views),
            }
            .map_err(|source| ModelError::Backend {
                tensor: name.clone(),
                source,
            })?;
            *done += views.iter().map(|t| t.data().len() as u64).sum::<u64>();
            // Converted: the file's pages of these weights are not needed again (the
            // embedding's rows are read again a row per token, from the file).
            for t in views {
                t.release_rows(0, t.info().n_rows() as usize);
            }
            Ok(Projection { name, op })
        };
        // The tensors `parts` (name, out_features), each `[k, out_features]`.
        let views = |parts: &[(&str, u64)], k: u64| -> Result<Vec<TensorView<'_>>, ModelError> {
            parts
                .iter()
                .map(|&(name, n)| tensor(name, &[k, n]))
                .collect()
        };

        let embd = tensor("token_embd.weight", &[e, c.n_vocab as u64])?;
        done += embd.data().len() as u64;
        progress(done, total);

        // The output projection first: converting a linear holds its converted copy beside
        // the weights already placed until it is placed itself, so the load's peak is what
        // is placed before the largest linear plus twice that linear. The output (vocab ×
        // n_embd) is the largest of every model here; converted last it put its copy on top
        // of all the others (Qwen2-0.5B: 130 MiB over 506 MiB of weights), converted first on
        // top of nothing. What is built does not depend on the order (each linear's rotation
        // is seeded by its tensor's name).
        let output_name = if file.tensor("output.weight").is_some() {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let output = linear(
            LinearRole::Output,
            &views(&[(output_name, c.n_vocab as u64)], e)?,
            &mut done,
            None,
        )?;
        progress(done, total);

        // The block count comes from the file: every layer has tensors in it, so no more
        // layers than tensors are reserved up front (2^40 layers aborted the process).
        let mut layers = Vec::with_capacity(c.n_layer.min(file.tensor_infos().len()));
        let fam = c.family;
        let hd = c.head_dim as u64;
        for i in 0..c.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            // A bias the family may have: loaded when the file has it, else refused.
            let optional_bias =
                |s: &str, len: u64, done: &mut u64| -> Result<Option<Vec<f32>>, ModelError> {
                    match file.tensor(&n(s)) {
                        None => Ok(None),
                        Some(_) if fam.optional_biases => vector(&n(s), len, done).map(Some),
                        Some(_) => Err(ModelError::Unsupported {
                            what: format!("tensor {:?} in a {} model", n(s), fam.name),
                        }),
                    }
                };
            let bias =
                |s: &str, len: u64, done: &mut u64| -> Result<Option<Vec<f32>>, ModelError> {
                    if fam.qkv_bias {
                        vector(&n(s), len, done).map(Some)
                    } else {
                        optional_bias(s, len, done)
                    }
                };
            // A fused QKV bias is read by no family here.
            if file.tensor(&n("attn_qkv.bias")).is_some() {
                return Err(ModelError::Unsupported {
                    what: format!("tensor {:?} in a {} model", n("attn_qkv.bias"), fam.name),
                });
            }
            let bo = optional_bias("attn_output.bias", e, &mut done)?;
            let b_gate = optional_bias("ffn_gate.bias", ff, &mut done)?;
            let b_up = optional_bias("ffn_up.bias", ff, &mut done)?;
            let b_down = optional_bias("ffn_down.bias", e, &mut done)?;
            let optional = |len: Option<u64>, s: &str, done: &mut u64| match len {
                Some(len) => vector(&n(s), len, done).map(Some),
                None => Ok(None),
            };
            // Q, K and V in one tensor where the file fuses them (phi3), else three.
            let fused_qkv = n("attn_qkv.weight");
            let (wq, wk, wv) = (n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight"));
            // Qwen3.5's full-attention layers: attn_q holds queries and gate values.
            let q_rows = if c.gated_attention { 2 * q } else { q };
            let qkv_parts: Vec<(&str, u64)> = if file.tensor(&fused_qkv).is_some() {
                vec![(&fused_qkv, q + 2 * kv)]
            } else {
                vec![(&wq, q_rows), (&wk, kv), (&wv, kv)]
            };
            let (wg, wu) = (n("ffn_gate.weight"), n("ffn_up.weight"));
            let gate_up_parts: Vec<(&str, u64)> = if fam.fused_gate_up {
                vec![(&wu, 2 * ff)]
            } else {
                vec![(&wg, ff), (&wu, ff)]
            };
            let attn_norm = vector(&n("attn_norm.weight"), e, &mut done)?;
            let mut delta = None;
            let (q_norm, k_norm, wqkv, bq, bk, bv, wo, conv) = match c.conv(i) {
                None if c.delta(i) => {
                    let Some(d) = &c.delta_net else {
                        unreachable!("a delta-net layer has its shapes")
                    };
                    let (nv, vd) = (d.n_v_heads as u64, d.value_dim() as u64);
                    let cd = d.conv_dim() as u64;
                    // Every shape checked before anything is converted.
                    let parts = views(
                        &[
                            (&n("attn_qkv.weight"), cd),
                            (&n("ssm_beta.weight"), nv),
                            (&n("ssm_alpha.weight"), nv),
                            (&n("attn_gate.weight"), vd),
                        ],
                        e,
                    )?;
                    let out = views(&[(&n("ssm_out.weight"), e)], vd)?;
                    let kernel = tensor(&n("ssm_conv1d.weight"), &[d.conv_kernel as u64, cd])?;
                    let dt_bias = vector(&n("ssm_dt.bias"), nv, &mut done)?;
                    let a = vector(&n("ssm_a"), nv, &mut done)?;
                    let norm = vector(&n("ssm_norm.weight"), d.head_dim as u64, &mut done)?;
                    done += kernel.data().len() as u64;
                    delta = Some(DeltaLayer {
                        params: Arc::new(DeltaParams {
                            shape: d.clone(),
                            conv: kernel.to_f32()?,
                            dt_bias,
                            a,
                            eps: c.rms_eps,
                        }),
                        norm,
                    });
                    let wqkv = linear(LinearRole::Qkv, &parts, &mut done, None)?;
                    let wo = linear(LinearRole::AttnOutput, &out, &mut done, None)?;
                    (None, None, wqkv, None, None, None, wo, None)
                }
                Some(taps) => {
                    let in_proj = n("shortconv.in_proj.weight");
                    let wqkv = linear(
                        LinearRole::Qkv,
                        &views(&[(&in_proj, 3 * e)], e)?,
                        &mut done,
                        None,
                    )?;
                    let kernel = tensor(&n("shortconv.conv.weight"), &[taps as u64, e])?;
                    done += kernel.data().len() as u64;
                    let out_proj = n("shortconv.out_proj.weight");
                    let wo = linear(
                        LinearRole::AttnOutput,
                        &views(&[(&out_proj, e)], e)?,
                        &mut done,
                        None,
                    )?;
                    (
                        None,
                        None,
                        wqkv,
                        None,
                        None,
                        None,
                        wo,
                        Some(kernel.to_f32()?),
                    )
                }
                None => {
                    let qk_norm_len = |heads: usize| match fam.qk_norm {
                        QkNorm::None => None,
                        QkNorm::PerHead => Some(hd),
                        QkNorm::Whole => Some((heads * c.head_dim) as u64),
                    };
                    (
                        optional(qk_norm_len(c.n_head), "attn_q_norm.weight", &mut done)?,
                        optional(qk_norm_len(c.n_head_kv), "attn_k_norm.weight", &mut done)?,
                        linear(LinearRole::Qkv, &views(&qkv_parts, e)?, &mut done, None)?,
                        bias("attn_q.bias", q, &mut done)?,
                        bias("attn_k.bias", kv, &mut done)?,
                        bias("attn_v.bias", kv, &mut done)?,
                        linear(
                            LinearRole::AttnOutput,
                            &views(&[(&n("attn_output.weight"), e)], q)?,
                            &mut done,
                            None,
                        )?,
                        None,
                    )
                }
            };
            let layer = Layer {
                attn_norm,
                q_norm,
                k_norm,
                wqkv,
                bq,
                bk,
                bv,
                wo,
                bo,
                conv,
                delta,
                attn_post_norm: optional(
                    fam.post_norms.then_some(e),
                    "post_attention_norm.weight",
                    &mut done,
                )?,
                ffn_norm: vector(&n(c.ffn_norm), e, &mut done)?,
                ffn: match c.moe_at(i).copied() {
                    None => Ffn::Dense(Expert {
                        gate_up: linear(
                            LinearRole::GateUp,
                            &views(&gate_up_parts, e)?,
                            &mut done,
                            None,
                        )?,
                        down: linear(
                            LinearRole::Down,
                            &views(&[(&n("ffn_down.weight"), e)], ff)?,
                            &mut done,
                            None,
                        )?,
                    }),
                    Some(_) if b_gate.is_some() || b_up.is_some() || b_down.is_some() => {
                        return Err(ModelError::Unsupported {
                            what: format!(
                                "feed-forward biases on the mixture-of-experts layer {i}"
                            ),
                        });
                    }
                    Some(moe) => {
                        let (ne, fx) = (moe.n_expert as u64, moe.n_ff_exp as u64);
                        // Every shape checked against the keys before anything is converted.
                        let router = tensor(&n("ffn_gate_inp.weight"), &[e, ne])?;
                        let stacks = [
                            tensor(&n("ffn_gate_exps.weight"), &[e, fx, ne])?,
                            tensor(&n("ffn_up_exps.weight"), &[e, fx, ne])?,
                            tensor(&n("ffn_down_exps.weight"), &[fx, e, ne])?,
                        ];
                        let shared = match moe.n_ff_shared {
                            None => None,
                            Some(fs) => {
                                let fs = fs as u64;
                                Some((
                                    views(
                                        &[
                                            (&n("ffn_gate_shexp.weight"), fs),
                                            (&n("ffn_up_shexp.weight"), fs),
                                        ],
                                        e,
                                    )?,
                                    views(&[(&n("ffn_down_shexp.weight"), e)], fs)?,
                                ))
                            }
                        };
                        let probs_b = n("exp_probs_b.bias");
                        let bias = if moe.selection_bias {
                            Some(vector(&probs_b, ne, &mut done)?)
                        } else if file.tensor(&probs_b).is_some() {
                            return Err(ModelError::Unsupported {
                                what: format!("tensor {probs_b:?} in a {} model", fam.name),
                            });
                        } else {
                            None
                        };
                        done += router.data().len() as u64;
                        let router = router.to_f32()?;
                        let mut experts = Vec::with_capacity(moe.n_expert);
                        for x in 0..moe.n_expert {
                            // Expert x of each stack, as a 2-D tensor of its own (in range: the
                            // stacks' shapes were checked).
                            let [g, u, d] = stacks.map(|t| {
                                t.info().matrix(x).ok_or_else(|| ModelError::MissingTensor {
                                    name: format!("{}[{x}]", t.name()),
                                })
                            });
                            let (g, u, d) = (&g?, &u?, &d?);
                            let view = |i| {
                                file.view_entry(i).ok_or_else(|| ModelError::MissingTensor {
                                    name: i.name().into(),
                                })
                            };
                            experts.push(Expert {
                                gate_up: linear(
                                    LinearRole::GateUp,
                                    &[view(g)?, view(u)?],
                                    &mut done,
                                    Some(x),
                                )?,
                                down: linear(LinearRole::Down, &[view(d)?], &mut done, Some(x))?,
                            });
                        }
                        let shared = match shared {
                            None => None,
                            Some((gate_up, down)) => Some(Expert {
                                gate_up: linear(LinearRole::GateUp, &gate_up, &mut done, None)?,
                                down: linear(LinearRole::Down, &down, &mut done, None)?,
                            }),
                        };
                        Ffn::Moe(Experts {
                            moe,
                            router,
                            bias,
                            experts,
                            shared,
                        })
                    }
                },
                ffn_post_norm: optional(
                    fam.post_norms.then_some(e),
                    "post_ffw_norm.weight",
                    &mut done,
                )?,
                b_gate,
                b_up,
                b_down,
            };
            layers.push(layer);
            progress(done, total);
        }
        let output_norm = vector(c.output_norm, e, &mut done)?;
        let rope_freqs = match file.tensor("rope_freqs.weight") {
            Some(_) => Some(vector(
                "rope_freqs.weight",
                (c.n_rot / 2) as u64,
                &mut done,
            )?),
            None => None,
        };
        factory.finish().map_err(|source| ModelError::Backend {
            tensor: "(finishing the weights)".into(),
            source,
        })?;
        // Every weight is converted: the file's pages that reading them mapped (each linear
        // released its own, but a read maps its neighbours' too) are dropped.
        file.release_data();
        progress(total, total);

        let weight_format = output.op.weight_format();
        Ok(Model {
            engine: factory.engine().cloned(),
            embd_ty: embd.ty(),
            embd_row_bytes: embd.row_bytes(),
            embd: file.shared(&embd),
            layers,
            output_norm,
            output,
            rope_freqs,
            pool,
            n_ctx: c.n_ctx,
            weight_format,
            config: c,
        })
    }

    /// Sets the context size of the sequences made from now on: `n_ctx` positions, or the
    /// trained context for 0 (llama.cpp's `-c`); more than the trained context is refused.
    pub fn set_context(&mut self, n_ctx: usize) -> Result<(), ModelError> {
        let trained = self.config.n_ctx;
        if n_ctx > trained {
            return Err(ModelError::ContextTooLarge {
                asked: n_ctx,
                trained,
            });
        }
        self.n_ctx = if n_ctx == 0 { trained } else { n_ctx };
        Ok(())
    }

    /// The context size of its sequences ([`Model::set_context`]; the trained context by
    /// default).
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The format its linears hold their weights in (`"f32"` on the host path, `"w8a8"` or `"f16"`
    /// on the NPU).
    pub fn weight_format(&self) -> &'static str {
        self.weight_format
    }

    /// The engine the linears run on, if they run on the NPU (or its emulator).
    pub fn engine(&self) -> Option<&Engine> {
        self.engine.as_ref()
    }

    /// The modelled NPU time so far, when the linears run on the in-process emulator.
    pub(crate) fn modelled_time(&self) -> Option<rknn_matmul::ModelledTime> {
        self.engine().and_then(|e| e.runtime().modelled_time())
    }

    /// What the model holds in memory, by kind, for a sequence of [`Model::n_ctx`] positions
    /// whose cache stores `ty`: the budget a process's resident memory is measured against.
    pub fn footprint(&self, ty: CacheType) -> Footprint {
        let c = &self.config;
        let vecs = |v: &[Option<&Vec<f32>>]| -> u64 {
            v.iter().flatten().map(|x| x.len() as u64 * 4).sum()
        };
        let mut host =
            self.embd.len() as u64 + vecs(&[Some(&self.output_norm), self.rope_freqs.as_ref()]);
        let mut weights = 0u64;
        let mut linear = |p: &Projection| {
            weights += p.op.in_features() as u64 * p.op.out_features() as u64 * 4;
        };
        linear(&self.output);
        for l in &self.layers {
            host += vecs(&[
                Some(&l.attn_norm),
                l.conv.as_ref(),
                l.delta.as_ref().map(|d| &d.norm),
                l.delta.as_ref().map(|d| &d.params.conv),
                l.delta.as_ref().map(|d| &d.params.dt_bias),
                l.delta.as_ref().map(|d| &d.params.a),
                l.q_norm.as_ref(),
                l.k_norm.as_ref(),
                l.attn_post_norm.as_ref(),
                l.ffn_post_norm.as_ref(),
                l.bq.as_ref(),
                l.bk.as_ref(),
                l.bv.as_ref(),
                l.bo.as_ref(),
                l.b_gate.as_ref(),
                l.b_up.as_ref(),
                l.b_down.as_ref(),
                Some(&l.ffn_norm),
            ]);
            for p in [&l.wqkv, &l.wo] {
                linear(p);
            }
            let experts = match &l.ffn {
                Ffn::Dense(x) => std::slice::from_ref(x),
                Ffn::Moe(m) => {
                    host += (m.router.len() + m.bias.as_ref().map_or(0, Vec::len)) as u64 * 4;
                    if let Some(x) = &m.shared {
                        linear(&x.gate_up);
                        linear(&x.down);
                    }
                    &m.experts[..]
                }
            };
            for x in experts {
                linear(&x.gate_up);
                linear(&x.down);
            }
        }
        // On the NPU the weights are what the engine booked (B, A and C); on the host, f32.
        if let Some(e) = &self.engine {
            weights = e.domain_bytes().iter().sum();
        }
        let elem = match ty {
            CacheType::F32 => 4,
            CacheType::F16 => 2,
        };
        // Per layer: positions held times bytes per position (a short-convolution layer's
        // n_embd f32 values; a local layer's keys and values); a delta-net layer's state with
        // its base, replay rows and checkpoints.
        let kv: u64 = (0..c.n_layer)
            .map(|l| match (c.conv(l), c.window(l)) {
                _ if c.delta(l) => c.delta_net.as_ref().map_or(0, DeltaState::max_bytes),
                (Some(taps), _) => self.n_ctx.min(2 * (taps + REWIND)) as u64 * c.n_embd as u64 * 4,
                (None, Some(w)) => {
                    self.n_ctx.min(2 * (w + REWIND)) as u64 * c.kv_dim() as u64 * 2 * elem
                }
                (None, None) => self.n_ctx as u64 * c.kv_dim() as u64 * 2 * elem,
            })
            .sum();
        Footprint { weights, host, kv }
    }

    /// The host pool its passes run on.
    pub fn pool(&self) -> &HostPool {
        &self.pool
    }
}
