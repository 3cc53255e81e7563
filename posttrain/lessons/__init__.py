"""posttrain lessons: the course as a local web app whose widgets run posttrain's own code."""
