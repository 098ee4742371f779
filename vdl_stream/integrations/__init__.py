"""Framework integrations: a callback or logger per training stack, each writing through vdl-stream.

Import the module of your framework; none is imported by ``import vdl_stream`` (or by this
package), so vdl-stream keeps working where a framework is missing:

- :mod:`vdl_stream.integrations.paddle`: ``VisualDL``, a ``paddle.Model.fit`` callback;
- :mod:`vdl_stream.integrations.lightning`: ``VdlStreamLogger``, a PyTorch Lightning ``Logger``;
- :mod:`vdl_stream.integrations.transformers`: ``VdlStreamCallback``, a Hugging Face
  ``TrainerCallback``;
- :mod:`vdl_stream.integrations.keras`: ``VdlStreamCallback``, a Keras 3 callback.

See docs/integrations.md.
"""
