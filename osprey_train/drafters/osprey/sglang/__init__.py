"""SGLang's external model package for the Osprey drafter (``SGLANG_EXTERNAL_MODEL_PACKAGE`` names it).

SGLang imports every module of the package it is given and collects their ``EntryClass``: this
package holds only the model class, so SGLang imports nothing else of Osprey.
"""
