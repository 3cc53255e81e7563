"""Every RL algorithm on the built-in task, same budget: see posttrain/bench/algorithms.py.

python benchmarks/algorithms.py --init runs/pipeline/sft --steps 50 --seeds 0,1,2
"""

from posttrain.bench.algorithms import main

if __name__ == "__main__":
    main()
