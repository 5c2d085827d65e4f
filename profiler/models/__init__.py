"""Local models without a hub (`ppd model prepare tiny|smollm2`)."""
