"""An example pipeline: OCR every page, embed its chunks, summarise the document."""
