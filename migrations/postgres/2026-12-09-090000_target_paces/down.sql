DROP TABLE paces;
