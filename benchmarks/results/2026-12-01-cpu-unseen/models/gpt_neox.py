import torch
from torch import nn
import transformers as T
CFG = {
 "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)),
 "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256, max_position_embeddings=64)),
 "mixtral": (T.MixtralConfig, T.MixtralForCausalLM, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2)),
}["gpt_neox"]
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = CFG[1](CFG[0](**CFG[2], use_cache=False)).eval()
    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).logits
def get_inputs(): return [torch.randint(0, 256, (2, 16))]
def get_init_inputs(): return []
