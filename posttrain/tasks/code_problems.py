"""The code task's problem table: one row per function family (name, arguments, description, the
reference solution's body, an input generator seeded per problem). tasks/code.py builds a problem
from each row, runs the reference in the parent process (never in the sandbox) for the expected outputs, and splits
train from held-out by name. Names are written with '_' for reading; the task drops it."""

from __future__ import annotations


def _ints(lo, hi, n=(3, 8)):
    return lambda r: [r.randint(lo, hi) for _ in range(r.randint(*n))]


def _word(r):
    return "".join(r.choice("abcdeiou rst") for _ in range(r.randint(1, 12))).strip() or "a"


def _with_repeated_max(r):
    """Distinct values in a shuffled order, the largest twice: a second largest that is the
    largest again, or a fixed number, is wrong."""
    xs = r.sample(range(-30, 30), r.randint(2, 6))
    xs.append(max(xs))
    r.shuffle(xs)
    return xs


def _clamp_args(r):
    """Bounds that move: a clamp that ignores lo or hi, or pins them to constants, is wrong."""
    lo = r.randint(-20, 10)
    return [r.randint(-30, 30), lo, lo + r.randint(0, 20)]


# name, args, description, reference solution (body after the def line), input generator
FAMILIES = [
    *[(f"add_{k}", "x", f"returns x plus {k}", f"return x + {k}", lambda r: [r.randint(-50, 50)]) for k in (3, 7, 12)],
    *[
        (f"times_{k}", "x", f"returns x multiplied by {k}", f"return x * {k}", lambda r: [r.randint(-50, 50)])
        for k in (2, 5)
    ],
    (
        "sum_digits",
        "n",
        "returns the sum of the decimal digits of the non-negative integer n",
        "return sum(int(c) for c in str(n))",
        lambda r: [r.randint(0, 10**6)],
    ),
    ("reverse_string", "s", "returns the string s reversed", "return s[::-1]", lambda r: [_word(r)]),
    (
        "is_palindrome",
        "s",
        "returns True when the string s reads the same backwards, else False",
        "return s == s[::-1]",
        lambda r: [r.choice([_word(r), "abba", "racecar", "ab"])],
    ),
    (
        "count_vowels",
        "s",
        "returns how many characters of s are vowels (a, e, i, o, u)",
        "return sum(c in 'aeiou' for c in s)",
        lambda r: [_word(r)],
    ),
    (
        "max_of_list",
        "xs",
        "returns the largest number in the non-empty list xs",
        "return max(xs)",
        lambda r: [_ints(-99, 99)(r)],
    ),
    (
        "second_largest",
        "xs",
        "returns the second largest distinct value in xs (which has at least two)",
        "return sorted(set(xs))[-2]",
        lambda r: [_with_repeated_max(r)],
    ),
    (
        "factorial",
        "n",
        "returns n! for a non-negative integer n",
        "import math\n    return math.factorial(n)",
        lambda r: [r.randint(0, 12)],
    ),
    (
        "fibonacci",
        "n",
        "returns the n-th Fibonacci number, with fibonacci(0) = 0 and fibonacci(1) = 1",
        "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        lambda r: [r.randint(0, 30)],
    ),
    (
        "gcd",
        "a, b",
        "returns the greatest common divisor of the positive integers a and b",
        "import math\n    return math.gcd(a, b)",
        lambda r: [r.randint(1, 200), r.randint(1, 200)],
    ),
    (
        "is_prime",
        "n",
        "returns True when the integer n is prime, else False",
        "return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
        lambda r: [r.randint(0, 100)],
    ),
    (
        "sum_evens",
        "xs",
        "returns the sum of the even numbers in the list xs",
        "return sum(x for x in xs if x % 2 == 0)",
        lambda r: [_ints(-20, 20)(r)],
    ),
    (
        "running_sum",
        "xs",
        "returns the list of running totals of xs",
        "out, t = [], 0\n    for x in xs:\n        t += x\n        out.append(t)\n    return out",
        lambda r: [_ints(-9, 9)(r)],
    ),
    (
        "dedupe",
        "xs",
        "returns xs without repeated values, keeping the first occurrence of each, in order",
        "return list(dict.fromkeys(xs))",
        lambda r: [_ints(0, 5)(r)],
    ),
    (
        "rotate_left",
        "xs, k",
        "returns the list xs rotated left by k positions (k may exceed len(xs))",
        "k %= len(xs)\n    return xs[k:] + xs[:k]",
        lambda r: [_ints(0, 9)(r), r.randint(0, 12)],
    ),
    (
        "count_words",
        "s",
        "returns the number of whitespace-separated words in s",
        "return len(s.split())",
        lambda r: [" ".join(_word(r) for _ in range(r.randint(0, 5)))],
    ),
    (
        "capitalize_words",
        "s",
        "returns s with the first letter of each space-separated word upper-cased",
        "return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
        lambda r: [" ".join(_word(r) for _ in range(r.randint(1, 4)))],
    ),
    (
        "fizzbuzz",
        "n",
        "returns the string fizzbuzz if n is divisible by 15, fizz if by 3, buzz if by 5, else str(n)",
        "return 'fizzbuzz' if n % 15 == 0 else 'fizz' if n % 3 == 0 else 'buzz' if n % 5 == 0 else str(n)",
        lambda r: [r.randint(1, 60)],
    ),
    (
        "celsius_to_fahrenheit",
        "c",
        "converts c degrees celsius to fahrenheit (c times 9, divided by 5, plus 32)",
        "return c * 9 / 5 + 32",
        lambda r: [r.randint(-40, 100)],
    ),
    (
        "clamp",
        "x, lo, hi",
        "returns x limited to the range [lo, hi]",
        "return max(lo, min(x, hi))",
        lambda r: _clamp_args(r),
    ),
    (
        "count_char",
        "s, c",
        "returns how many times the character c occurs in s",
        "return s.count(c)",
        lambda r: [_word(r), r.choice("aeirst")],
    ),
    (
        "flatten",
        "xss",
        "returns the concatenation of the lists in xss",
        "return [x for xs in xss for x in xs]",
        lambda r: [[_ints(0, 9, (0, 3))(r) for _ in range(r.randint(0, 4))]],
    ),
    (
        "digits_to_int",
        "ds",
        "returns the integer whose decimal digits are the list ds (most significant first)",
        "return int(''.join(map(str, ds)))",
        lambda r: [[r.randint(1, 9)] + _ints(0, 9, (0, 5))(r)],
    ),
    (
        "square_all",
        "xs",
        "returns the list of the squares of xs",
        "return [x * x for x in xs]",
        lambda r: [_ints(-9, 9)(r)],
    ),
    (
        "min_max",
        "xs",
        "returns [min(xs), max(xs)] for a non-empty list xs",
        "return [min(xs), max(xs)]",
        lambda r: [_ints(-50, 50)(r)],
    ),
    (
        "is_power_of_two",
        "n",
        "returns True when the positive integer n is a power of two, else False",
        "return n & (n - 1) == 0",
        lambda r: [r.choice([1, 2, 3, 6, 8, 12, 16, 64, 96, 1024])],
    ),
    (
        "char_frequency",
        "s",
        "returns a dict mapping each character of s to how often it occurs",
        "out = {}\n    for c in s:\n        out[c] = out.get(c, 0) + 1\n    return out",
        lambda r: [_word(r)],
    ),
    (
        "merge_sorted",
        "a, b",
        "merges the sorted lists a and b into one sorted list",
        "return sorted(a + b)",
        lambda r: [sorted(_ints(0, 20, (0, 5))(r)), sorted(_ints(0, 20, (0, 5))(r))],
    ),
    (
        "binary_string",
        "n",
        "returns the binary representation of the non-negative integer n without a prefix",
        "return bin(n)[2:]",
        lambda r: [r.randint(0, 1000)],
    ),
    (
        "count_positive",
        "xs",
        "returns how many numbers in xs are greater than zero",
        "return sum(x > 0 for x in xs)",
        lambda r: [_ints(-9, 9)(r)],
    ),
    (
        "abs_diff",
        "a, b",
        "returns the absolute difference of a and b",
        "return abs(a - b)",
        lambda r: [r.randint(-50, 50), r.randint(-50, 50)],
    ),
    (
        "last_element",
        "xs",
        "returns the last element of the non-empty list xs",
        "return xs[-1]",
        lambda r: [_ints(0, 99)(r)],
    ),
    (
        "mean",
        "xs",
        "returns the arithmetic mean of the non-empty list xs",
        "return sum(xs) / len(xs)",
        lambda r: [_ints(0, 20)(r)],
    ),
    (
        "vowel_positions",
        "s",
        "returns the list of indices i where s[i] is a vowel (a, e, i, o, u)",
        "return [i for i, c in enumerate(s) if c in 'aeiou']",
        lambda r: [_word(r)],
    ),
]
