"""ada_jax: RL post-training of LLMs with adaptive sampling (Reinforce-Ada) in JAX.

Modules are imported explicitly (`from ada_jax import model`); importing the
package itself stays cheap so pure-numpy parts (controller, verifier) load
without JAX.
"""

__version__ = '0.1.0'
