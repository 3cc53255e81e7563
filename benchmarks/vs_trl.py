"""posttrain rl vs TRL GRPOTrainer on the same tiny HF Llama: see posttrain/bench/trl.py.

python benchmarks/vs_trl.py [--steps 12] [--shapes 64x16,8x16] [--out benchmarks/results/vs_trl.json]
"""

from posttrain.bench.trl import main

if __name__ == "__main__":
    main()
