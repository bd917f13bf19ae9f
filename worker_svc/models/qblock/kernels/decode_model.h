/* The native decode step's two structures (decode_step.c), as Python fills them
 * (worker_svc/models/qblock/native.py, `_Model` and `_Batch`: the same fields in the same
 * order), and the codes they use. */
#ifndef CBSERVE_DECODE_MODEL_H
#define CBSERVE_DECODE_MODEL_H

#include <stdint.h>

enum { NORM_INPUT = 0, NORM_POST = 1, NORMS = 2 };
enum { PROJ_QKV = 0, PROJ_O = 1, PROJ_GATE_UP = 2, PROJ_DOWN = 3, PROJS = 4 };
/* Shared-out loops a layer: five, and two more for each post-norm (Gemma's); a mixture
 * layer has one more than a dense one (its router's, decode_experts.h). */
enum { LOOPS_PER_LAYER = 10 };
enum { KV_FLOAT32 = 0, KV_FLOAT16 = 1 }; /* the pool's element type */

/* A projection's weight as runs of output rows, each run in its own block format: one
 * run, unless a fused weight's parts are stored in different formats (a Q4_K_M file's
 * Q4_K q and k beside its Q6_K v; compute/qblock_stack.py). */
enum { WEIGHT_RUNS = 3 };
struct block_weight {
    int64_t runs;                       /* 1 .. WEIGHT_RUNS */
    int64_t run_end[WEIGHT_RUNS];       /* the output row after run i's last */
    int64_t format[WEIGHT_RUNS];        /* QBLOCK_FORMAT_* */
    const uint8_t *blocks[WEIGHT_RUNS]; /* run i's rows of blocks */
    /* 1: one Q4_1 run whose input takes 8-bit activation blocks where the VNNI kernel
     * runs (qblock_vnni8.c; QBlockLinear.act8, compute/qblock_linear.py); else 0. */
    int64_t act8;
};

/* A mixture layer's router and experts (models/forward/experts.py's ExpertMlp): each
 * expert's fused gate/up [2 I, hidden] (gate's rows, then up's) and down [hidden, I]. */
struct moe_layer {
    int64_t sparse;                       /* 0: the layer's MLP is the dense one */
    const float *router;                  /* [experts, hidden] float32 */
    const float *router_bias;             /* [experts], NULL: none */
    const struct block_weight *gate_up;   /* [experts] */
    const struct block_weight *down;      /* [experts] */
    const int64_t *gate_up_bias;          /* [experts] addresses of float [2 I], 0: none */
    const int64_t *down_bias;             /* [experts] addresses of float [hidden], 0: none */
    /* Qwen2-MoE's shared expert (decode_shared_expert.h), NULL: none; its gate/up
     * [2 shared I, hidden], down [hidden, shared I], and its gate's float32 [hidden] row
     * (NULL: added ungated). */
    const struct block_weight *shared_gate_up, *shared_down;
    const float *shared_gate;
};
enum { ROUTER_SOFTMAX_TOPK = 0, ROUTER_TOPK_SOFTMAX = 1 };

/* The model, prepared once at load. Addresses are int64 so that Python can keep them in
 * one tensor; every array is contiguous. */
struct decode_model {
    int64_t hidden, intermediate, num_layers, num_heads, num_kv_heads, head_dim, vocab;
    double eps, scale;
    const float *embed;      /* [vocab, hidden] */
    const float *final_norm; /* [hidden] */
    const struct block_weight *lm_head; /* [vocab] rows */
    const int64_t *norms;               /* [layers][NORMS] addresses of float [hidden] */
    const struct block_weight *weights; /* [layers][PROJS] */
    /* What the architecture's declaration varies by layer (models/declaration.py). */
    const int64_t *rope_tables; /* [layers][2] addresses of cos, sin [positions, d / 2] */
    const int64_t *windows;     /* [layers] sliding window, 0 for full attention */
    const int64_t *qkv_biases;  /* [layers] address of float [qkv width], 0: none */
    const int64_t *qk_norms;    /* [layers][2] addresses of float [head_dim], 0: none */
    const int64_t *post_norms;  /* [layers][2] after attention, after the MLP; 0: none */
    const int64_t *sinks;       /* [layers] address of float [num_heads] sink logits, 0: none */
    const int64_t *o_biases;    /* [layers] address of float [hidden], 0: none */
    int64_t activation;         /* ACTIVATION_SILU or ACTIVATION_GELU_TANH */
    double embed_scale;         /* the embedding's multiplier (Gemma); 0: none */
    /* The mixture (models/mixture.py's MoeSpec); num_experts 0: every layer is dense. */
    const struct moe_layer *moe_layers; /* [layers] */
    int64_t num_experts, experts_per_token, expert_intermediate;
    int64_t router;            /* ROUTER_* */
    int64_t normalize_topk;    /* softmax_topk: the k weights divided by their sum */
    int64_t expert_activation; /* ACTIVATION_SILU or ACTIVATION_SWIGLU_CLAMPED */
    double swiglu_alpha, swiglu_limit;
    /* LoRA adapters (decode_lora.h): [layers][PROJS][2] addresses of a projection's a
     * [slots, parts * rank, in] and b [slots, parts * rank, out], float32 or bfloat16
     * (lora_bf16); 0: the projection has none (a mixture layer's MLP). NULL: no store. */
    const int64_t *lora;
    int64_t lora_rank;  /* the store's max rank: each part's rows of a and b */
    int64_t lora_slots; /* slots in the store, the base's 0 included */
    const int32_t *lora_ranks; /* [slots] each slot's adapter rank (rows read per part) */
    int64_t lora_bf16;         /* 1: a and b are bfloat16, else float32 */
    int64_t shared_intermediate; /* a shared expert's intermediate width; 0: none */
};

/* One step. */
struct decode_batch {
    int64_t num_tokens;
    const int64_t *token_ids, *positions, *slot_mapping; /* [T] */
    const int32_t *block_tables;                         /* [T, max_blocks] */
    const int32_t *context_lens;                         /* [T] */
    int64_t max_blocks;
    void *kv_cache; /* [layers, 2, num_blocks, block_size, kv_heads, head_dim] */
    int64_t kv_dtype; /* KV_FLOAT32 or KV_FLOAT16 */
    int64_t num_blocks, block_size;
    const int64_t *sample_rows; /* [S] rows of T */
    int64_t num_samples;
    float *logits; /* [S, vocab] */
    int64_t threads, variant, schedule;
    int64_t vnni_from_m; /* 0: never */
    int64_t spin;        /* pauses a thread spins at a barrier before it sleeps */
    int64_t chained;     /* 1: some rows share a sequence (drafts): K/V first, then attend */
    const int32_t *row_slots; /* [T] each row's adapter slot, 0: the base; NULL: all base */
    int64_t bf16_from_m; /* rows from which BF16 rows take the bf16 panels; 0: never */
};

#endif
