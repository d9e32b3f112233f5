"""Distillation: students (construction, layer mapping, init), the losses, the chunked vocabulary loss, the
packed encoder, the SQuAD step's objectives, the readable reference of the pretraining loss."""
