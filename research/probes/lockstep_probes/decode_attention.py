import torch, time, math
import torch.nn.functional as F
torch.set_num_threads(1)
def bench(name, fn, n=200):
    fn(); t=time.process_time()
    for _ in range(n): fn()
    print(f"{name:50s} {(time.process_time()-t)/n*1e6:8.1f} us")
from race.flops.catalog import load_hf_config
c=load_hf_config("race/tiny-reasoner"); print({k:c[k] for k in ("hidden_size","num_attention_heads","num_key_value_heads","num_hidden_layers","intermediate_size","vocab_size")})
H=c["num_attention_heads"]; Hkv=c["num_key_value_heads"]; d=c["hidden_size"]//H
for B,K in ((64,150),(192,150)):
    q=torch.randn(B,H,1,d); k=torch.randn(B,Hkv,K,d); v=torch.randn(B,Hkv,K,d)
    mask=torch.ones(B,1,1,K,dtype=torch.bool); mask[:, :, :, :10]=False
    bench(f"sdpa bool mask B={B} K={K}", lambda: F.scaled_dot_product_attention(q,k,v,attn_mask=mask,enable_gqa=Hkv!=H))
    fmask=torch.zeros(B,1,1,K).masked_fill(~mask, float("-inf"))
    bench(f"sdpa float mask", lambda: F.scaled_dot_product_attention(q,k,v,attn_mask=fmask,enable_gqa=Hkv!=H))
    rep=H//Hkv
    def manual():
        qq=q.view(B,Hkv,rep,d)  # [B,Hkv,rep,d]
        s=(qq @ k.transpose(-1,-2))/math.sqrt(d)   # [B,Hkv,rep,K]
        s=s+fmask  # broadcast [B,1,1,K]
        p=torch.softmax(s,-1)
        return (p@v).view(B,H,1,d)
    bench("manual matmul attention (GQA grouped)", manual)
    ref=F.scaled_dot_product_attention(q,k,v,attn_mask=mask,enable_gqa=Hkv!=H)
    print("   max diff", float((manual()-ref).abs().max()))
    x=torch.randn(B,c["hidden_size"]); W=torch.randn(c["vocab_size"], c["hidden_size"])
    bench("lm_head linear", lambda: F.linear(x, W))
    W2=torch.randn(3*c["hidden_size"], c["hidden_size"])
    bench("qkv-ish linear", lambda: F.linear(x, W2))
