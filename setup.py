"""lingshard: a Lingvo-style TensorFlow zoo for GShard, GPipe and MoE."""

import setuptools

setuptools.setup(
    name='lingshard',
    version='0.1.0',
    description=('Lingvo-style TensorFlow model zoo for giant conditional-'
                 'computation models: GShard, GPipe, Sparsely-Gated MoE.'),
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=setuptools.find_packages(include=['lingshard', 'lingshard.*']),
    python_requires='>=3.10',
    install_requires=[
        'tensorflow~=2.21.0',
        'tensorflow-text~=2.21.0',
        'sentencepiece>=0.2,<0.3',
        'absl-py>=2.1,<3',
        'sacrebleu>=2.4,<3',
        'numpy>=1.26,<3',
        # Reads the gettext catalogs of the multilingual corpus.
        'polib>=1.2,<2',
    ],
    extras_require={
        # pytest-xdist: `make test` runs the suite on every core, one test
        # file per worker (module fixtures such as the README run stay whole).
        'test': ['pytest>=8,<10', 'pytest-xdist>=3.6,<4',
                 'hypothesis>=6.100,<7', 'ruff>=0.6,<1'],
        # The SPMD checker uses jaxlib as the standalone XLA partitioner and
        # runtime; lingshard/spmd/xla_runtime.py checks this exact version.
        # matplotlib draws the benchmark scripts' plots and the evidence
        # page's (python -m lingshard.experiments).
        'spmd': ['jax==0.10.2', 'jaxlib==0.10.2', 'matplotlib>=3.8,<4'],
    },
    entry_points={},
)
